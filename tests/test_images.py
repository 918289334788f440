"""load_image on real files made with Pillow: every bad input gives an ImageError with a reason."""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import pytest
from PIL import Image, ImageFile

from stair_es.errors import ImageError, InvalidInputError
from stair_es.images import IMAGE_EXTENSIONS, iter_image_files, load_image


def _save(img: Image.Image, path, **kw):
    img.save(path, **kw)
    return path


def _photo(w=200, h=150, mode="RGB"):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(arr, "RGB").convert(mode)


def test_image_error_is_an_invalid_input_error():
    assert issubclass(ImageError, InvalidInputError)


def test_plain_jpeg_path_str_and_bytes(tmp_path):
    p = _save(_photo(), tmp_path / "a.jpg")
    for src in (p, str(p), p.read_bytes()):
        img = load_image(src)
        assert img.mode == "RGB" and img.size == (200, 150)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.jpg"
    p.write_bytes(b"")
    with pytest.raises(ImageError, match="empty file"):
        load_image(p)
    with pytest.raises(ImageError, match="empty file"):
        load_image(b"")


def test_not_an_image(tmp_path):
    p = tmp_path / "notes.jpg"
    p.write_text("just some text, not pixels\n" * 10)
    with pytest.raises(ImageError, match=r"not an image \(cannot identify format\)"):
        load_image(p)


@pytest.mark.parametrize("fmt,ext", [("JPEG", "jpg"), ("PNG", "png")])
def test_truncated_image_is_an_error(tmp_path, fmt, ext):
    full = io.BytesIO()
    _photo(400, 300).save(full, format=fmt)
    data = full.getvalue()
    p = tmp_path / f"cut.{ext}"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="truncated|damaged|decode"):
        load_image(p)


def test_truncated_stays_an_error_even_if_app_allows_truncated(tmp_path):
    full = io.BytesIO()
    _photo(400, 300).save(full, format="JPEG")
    data = full.getvalue()
    old = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        with pytest.raises(ImageError):
            load_image(data[: len(data) // 2])
        assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the application's choice is put back
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = old


def test_missing_file(tmp_path):
    with pytest.raises(ImageError, match="no such file"):
        load_image(tmp_path / "nope.png")


def test_folder_is_not_an_image(tmp_path):
    with pytest.raises(ImageError, match="folder"):
        load_image(tmp_path)


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file(tmp_path):
    p = _save(_photo(), tmp_path / "locked.png")
    p.chmod(0)
    try:
        with pytest.raises(ImageError, match="permission denied"):
            load_image(p)
    finally:
        p.chmod(0o644)


def test_decompression_bomb_refused_before_decoding(tmp_path):
    # A 1-bit PNG is tiny on disk but has many pixels.
    p = tmp_path / "bomb.png"
    Image.new("1", (10000, 8000)).save(p)
    assert p.stat().st_size < 2_000_000
    with pytest.raises(ImageError, match=r"10000x8000 = 80,000,000 pixels, more than the limit of 64,000,000"):
        load_image(p)
    # Beyond Pillow's own hard limit (2 x 89 M pixels) its error is converted, with the size
    big = tmp_path / "bigger.png"
    Image.new("1", (20000, 20000)).save(big)
    with pytest.raises(ImageError, match=r"400,000,000 pixels, more than the limit of 64,000,000"):
        load_image(big)
    with pytest.raises(ImageError, match="decompression bomb"):
        load_image(big, max_pixels=10**12)


def test_small_limit(tmp_path):
    p = _save(_photo(100, 100), tmp_path / "x.png")
    with pytest.raises(ImageError, match="10,000 pixels, more than the limit of 5,000"):
        load_image(p, max_pixels=5000)
    assert load_image(p, max_pixels=None).size == (100, 100)


def test_huge_allowed_jpeg_is_downscaled(tmp_path):
    p = _save(Image.new("RGB", (6000, 3000), (10, 200, 30)), tmp_path / "big.jpg", quality=80)
    img = load_image(p, target_max_side=1024)
    assert img.size == (1024, 512)
    assert img.getpixel((500, 250))[1] > 150
    assert load_image(p, target_max_side=None).size == (6000, 3000)


def test_large_png_downscaled_keeps_aspect(tmp_path):
    p = _save(Image.new("RGB", (3000, 1000), "blue"), tmp_path / "wide.png")
    assert load_image(p, target_max_side=300).size == (300, 100)


def test_cmyk_jpeg(tmp_path):
    p = _save(Image.new("CMYK", (64, 64), (0, 255, 255, 0)), tmp_path / "cmyk.jpg")  # red
    r, g, b = load_image(p).getpixel((32, 32))
    assert r > 200 and g < 60 and b < 60


@pytest.mark.parametrize("mode", ["L", "1"])
def test_greyscale_modes(tmp_path, mode):
    p = _save(Image.new(mode, (32, 32), 255 if mode == "L" else 1), tmp_path / f"g_{mode}.png")
    img = load_image(p)
    assert img.mode == "RGB" and img.getpixel((0, 0)) == (255, 255, 255)


def test_16bit_greyscale_is_scaled_not_clipped(tmp_path):
    arr = np.full((16, 16), 32768, dtype=np.uint16)  # mid-grey in 16 bits
    p = tmp_path / "g16.png"
    Image.fromarray(arr).save(p)
    assert Image.open(p).mode.startswith("I")
    r, g, b = load_image(p).getpixel((0, 0))
    assert 120 <= r <= 135 and r == g == b


def test_palette_with_transparency_on_white(tmp_path):
    img = Image.new("P", (20, 20), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    img.paste(1, (10, 0, 20, 20))
    p = tmp_path / "pal.png"
    img.save(p, transparency=0)
    out = load_image(p)
    assert out.getpixel((2, 2)) == (255, 255, 255)  # transparent black -> white
    assert out.getpixel((15, 2)) == (255, 0, 0)


@pytest.mark.parametrize("mode", ["RGBA", "LA"])
def test_alpha_composited_on_white(tmp_path, mode):
    fill = (0, 0, 0, 0) if mode == "RGBA" else (0, 0)
    p = _save(Image.new(mode, (8, 8), fill), tmp_path / f"a_{mode}.png")
    assert load_image(p).getpixel((4, 4)) == (255, 255, 255)


def test_exif_orientation_applied(tmp_path):
    img = Image.new("RGB", (40, 20), "red")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    p = tmp_path / "rot.jpg"
    img.save(p, exif=exif.tobytes())
    assert load_image(p).size == (20, 40)


def test_animated_gif_first_frame(tmp_path):
    frames = [Image.new("RGB", (16, 16), c) for c in ("red", "green", "blue")]
    p = tmp_path / "anim.gif"
    frames[0].save(p, save_all=True, append_images=frames[1:], duration=50)
    out = load_image(p)
    r, g, b = out.getpixel((8, 8))
    assert r > 200 and g < 50 and b < 50


def test_pil_input_is_copied_and_converted():
    src = Image.new("RGBA", (10, 10), (0, 0, 255, 255))
    out = load_image(src)
    assert out.mode == "RGB" and out is not src and out.getpixel((0, 0)) == (0, 0, 255)
    rgb = Image.new("RGB", (10, 10))
    assert load_image(rgb) is not rgb


def test_unsupported_source_type():
    with pytest.raises(ImageError, match="pass a path"):
        load_image(12345)  # type: ignore[arg-type]


def test_iter_image_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    for rel in ("b.JPG", "a.png", "sub/c.webp", ".hidden/d.png", "notes.txt", ".e.jpg"):
        (tmp_path / rel).write_bytes(b"x")
    names = [p.relative_to(tmp_path).as_posix() for p in iter_image_files(tmp_path)]
    assert names == ["a.png", "b.JPG", "sub/c.webp"]
    assert [p.name for p in iter_image_files(tmp_path, recursive=False)] == ["a.png", "b.JPG"]
    assert [p.name for p in iter_image_files(str(tmp_path / "**" / "*.webp"))] == ["c.webp"]
    assert [p.name for p in iter_image_files(tmp_path / "a.png")] == ["a.png"]
    with pytest.raises(ImageError, match="no such file or folder"):
        list(iter_image_files(tmp_path / "missing"))
    assert ".jpg" in IMAGE_EXTENSIONS


def test_permission_denied_message(tmp_path, monkeypatch):
    # runs as root too: simulate the OS refusing the read
    import stair_es.images as images_mod

    p = _save(_photo(), tmp_path / "locked2.png")

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(images_mod, "open", refuse, raising=False)
    with pytest.raises(ImageError, match="permission denied"):
        load_image(p)


def test_thread_pool_loading(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    paths = [_save(_photo(64, 48), tmp_path / f"t{i}.jpg") for i in range(16)]
    (tmp_path / "bad.jpg").write_bytes(b"nope")
    paths.append(tmp_path / "bad.jpg")

    def safe(p):
        try:
            return load_image(p).size
        except ImageError as e:
            return str(e)

    with ThreadPoolExecutor(4) as pool:
        out = list(pool.map(safe, paths))
    assert out[:16] == [(64, 48)] * 16 and "not an image" in out[16]


def test_min_side_decodes_a_big_jpeg_small_but_never_below_what_the_encoder_needs(tmp_path):
    import numpy as np
    from PIL import Image

    from stair_es.images import load_image

    rng = np.random.default_rng(0)
    big = Image.fromarray(rng.integers(0, 255, (3000, 4000, 3), dtype=np.uint8))
    path = tmp_path / "big.jpg"
    big.save(path, quality=80)
    img = load_image(path, min_side=256)
    assert 256 <= min(img.size) < 512  # 1/8 DCT scale: 375 x 500
    assert img.size[0] / img.size[1] == pytest.approx(4 / 3, rel=0.01)
    small = tmp_path / "small.jpg"
    big.resize((300, 225)).save(small)
    assert load_image(small, min_side=256).size == (300, 225)  # never upscaled, never reduced below need
    png = tmp_path / "big.png"
    big.resize((2400, 1800)).save(png)
    assert 256 <= min(load_image(png, min_side=256).size) < 1024
