#!/usr/bin/env bash
# Carry a model into a machine with no network: the transcript in docs/pretrained.md
# ("Getting and carrying models"), reproducible on a machine without the hub.
#
#   bash scripts/carry_model_demo.sh [WORK]        (WORK default: a new temporary folder)
#
# A tiny random CLIP checkpoint (benchmarks/clip_models.py) stands in for a hub model: it is
# laid out as the Hugging Face client caches a download, so `models pull` runs the real client
# (offline, from that cache). "online" is one data home; "airgapped" is another, empty one,
# whose commands run in a network namespace with no interfaces (`unshare -n`, needs root;
# without it they run with HF_HUB_OFFLINE=1 and STAIR_ES_OFFLINE=1 only, and say so).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
STAIR="$(dirname "$PY")/stair-es"
WORK="${1:-$(mktemp -d -t stair-es-carry-XXXX)}"
mkdir -p "$WORK"
cd "$WORK"

show() {  # print the command as typed (stair-es for the venv's path, quotes kept), then run it
  local line="\$" a
  for a in "$@"; do
    [[ "$a" == "$STAIR" ]] && a=stair-es
    [[ "$a" == *" "* ]] && a="\"$a\""
    line+=" $a"
  done
  echo "$line"
  "$@"
}

# --- a model "downloaded" into the hub cache, and some photos -------------------------------------
"$PY" - "$WORK" "$REPO" <<'EOF'
import hashlib, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
work = Path(sys.argv[1])
from benchmarks.clip_models import make_clip
ckpt = make_clip(work / "ckpt")
repo = work / "hf" / "models--acme--tiny-clip"
commit = hashlib.sha1(b"acme/tiny-clip").hexdigest()
snap = repo / "snapshots" / commit
for d in (repo / "refs", snap, repo / "blobs"):
    d.mkdir(parents=True, exist_ok=True)
(repo / "refs" / "main").write_text(commit)
for f in sorted(ckpt.iterdir()):
    data = f.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (repo / "blobs" / digest).write_bytes(data)
    if not (snap / f.name).exists():
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / digest)
import skimage.data as d
from PIL import Image
photos = work / "photos"
photos.mkdir(exist_ok=True)
for name, caption in {"chelsea": "a cat", "coffee": "a cup of coffee", "astronaut": "an astronaut",
                      "rocket": "a rocket on its launch pad"}.items():
    Image.fromarray(getattr(d, name)()).convert("RGB").save(photos / f"{name}.jpg", quality=90)
    (photos / f"{name}.txt").write_text(caption)
EOF
cd "$WORK"
export PYTHONPATH="$REPO"

echo "## on the machine with internet"
export STAIR_ES_HOME="$WORK/online" HF_HUB_CACHE="$WORK/hf" HF_HUB_OFFLINE=1
show "$STAIR" models pull acme/tiny-clip --encoder clip-vocab
mkdir -p carry
# (the encoder's progress bar, drawn while it embeds the vocabulary, is left out here)
show "$STAIR" models export acme/tiny-clip carry/tiny-clip.tar 2>/dev/null
unset HF_HUB_CACHE HF_HUB_OFFLINE

echo
echo "## on the machine with no network"
cat > airgapped.sh <<EOF
set -euo pipefail
export STAIR_ES_HOME="$WORK/airgapped" PYTHONPATH="$REPO"
$(declare -f show)
STAIR="$STAIR"
show "$STAIR" models import carry/tiny-clip.tar
show "$STAIR" models list
show "$STAIR" ingest photos photos/ --encoder clip-vocab --model acme/tiny-clip --no-progress
show "$STAIR" search photos "a cup of coffee" --top-k 3
show "$STAIR" search photos --image photos/rocket.jpg --top-k 3
echo "\\$ stair-es index stats photos --json    # (its model_record part)"
"$STAIR" index stats photos --json | grep -A4 '"model_record"'
echo "\\$ # the same search in a Python that cannot import torch or transformers"
"$PY" -c "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; from stair_es.cli.main import main; sys.argv[0] = 'stair-es'; main()" search photos "a cup of coffee" --top-k 3
EOF
if unshare -n true 2>/dev/null; then
  unshare -n bash airgapped.sh
else
  echo "(unshare -n is not available: running with HF_HUB_OFFLINE=1 STAIR_ES_OFFLINE=1 only)"
  HF_HUB_OFFLINE=1 STAIR_ES_OFFLINE=1 bash airgapped.sh
fi
