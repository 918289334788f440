"""The results page at ``/``: a search form, metadata filters and a thumbnail grid, rendered
on the server so the plain result list works with JavaScript disabled.

``static/app.js`` (no CDN, no framework) then adds per-hit token chips with contribution
bars from ``POST /v1/explain``, asking again through ``static/retry.js`` for the explain calls
and thumbnails a busy server shed (429/503). Every value that reaches the HTML is escaped here.
This module knows the service's search and index listing, not the HTTP routes or admission.
"""

from __future__ import annotations

import html
import json
from typing import Any, Mapping, Sequence
from urllib.parse import quote

from ..errors import StairError
from .errors import retry_headers

MAX_PAGE_K = 60


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


def filters_from_params(fields: Mapping[str, str], params: Mapping[str, str], wheres: Sequence[str]) -> list[str]:
    """Form fields -> `--where` conditions: ``f.NAME`` (equals; ``a|b`` for any of), ``min.NAME`` / ``max.NAME``."""
    out = [w for w in wheres if w.strip()]
    for name, ftype in fields.items():
        v = (params.get(f"f.{name}") or "").strip()
        if v:
            out.append(f"{name}={v}")
        if ftype in ("integer", "float", "date", "number", "long", "double"):
            lo, hi = (params.get(f"min.{name}") or "").strip(), (params.get(f"max.{name}") or "").strip()
            if lo:
                out.append(f"{name}>={lo}")
            if hi:
                out.append(f"{name}<={hi}")
    return out


def busy_page(message: str, retry_after_ms: int) -> bytes:
    """The page a browser gets when the server sheds ``/`` (429): what happened, in HTML rather than
    the API's JSON, and a refresh after the server's ``Retry-After`` (so it comes back by itself)."""
    wait = retry_headers(retry_after_ms)["Retry-After"]  # whole seconds, as the header says
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='refresh' content='{wait}'><title>busy - stair-es</title>"
            "<link rel='stylesheet' href='/static/style.css'></head><body>"
            "<header><h1><a href='/'>stair-es</a></h1></header>"
            f"<p class='error'>The server is busy; this page reloads in {wait} s. ({_e(message)})</p>"
            "</body></html>").encode()


def render_page(service, params: Mapping[str, str], wheres: Sequence[str]) -> str:
    indices = [i for i in service.indices() if "error" not in i]
    names = [i["name"] for i in indices]
    index = params.get("index") or service.config.default_index or (names[0] if names else "")
    info = next((i for i in indices if i["name"] == index), None)
    fields: dict[str, str] = dict(info["fields"]) if info else {}
    q = (params.get("q") or "").strip()
    try:
        k = max(1, min(int(params.get("k") or 24), MAX_PAGE_K))
    except ValueError:
        k = 24
    conditions = filters_from_params(fields, params, wheres)
    stair = bool(info and info.get("encoder") == "stair")  # the heatmap overlay needs a STAIR model

    body: dict[str, Any] = {}
    result: dict[str, Any] | None = None
    error = None
    if q and info:
        body = {"index": index, "text": q, "where": conditions, "top_k": k}
        try:
            result = service.search(body)
        except StairError as e:
            error = str(e)
    elif q and not info:
        error = f"no index {index!r}" if index else "there is no index to search yet; ingest one with `stair-es ingest`"

    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           "<meta name='viewport' content='width=device-width, initial-scale=1'>",
           f"<title>{_e(q + ' - ' if q else '')}stair-es</title>",
           "<link rel='stylesheet' href='/static/style.css'></head><body>",
           "<header><h1><a href='/'>stair-es</a></h1>",
           "<form id='search' method='get' action='/' role='search'>"]
    out.append("<label>index <select name='index'>" + "".join(
        f"<option value='{_e(n)}'{' selected' if n == index else ''}>{_e(n)}</option>" for n in names) + "</select></label>")
    out.append(f"<input id='q' type='search' name='q' value='{_e(q)}' placeholder='describe the image…' autofocus>")
    out.append(f"<input type='hidden' name='k' value='{k}'><button type='submit'>Search</button>")
    if fields:
        out.append("<fieldset class='filters'><legend>filters</legend>")
        for name, ftype in sorted(fields.items()):
            if ftype in ("integer", "float", "date", "number", "long", "double"):
                out.append(f"<label>{_e(name)} <input name='min.{_e(name)}' value='{_e(params.get('min.' + name, ''))}' "
                           f"placeholder='min' size='8'> – <input name='max.{_e(name)}' "
                           f"value='{_e(params.get('max.' + name, ''))}' placeholder='max' size='8'></label>")
            else:
                out.append(f"<label>{_e(name)} <input name='f.{_e(name)}' value='{_e(params.get('f.' + name, ''))}' "
                           f"placeholder='any' size='12'></label>")
        out.append("</fieldset>")
    out.append("</form></header><main>")
    if error:
        out.append(f"<p class='error' role='alert'>{_e(error)}</p>")
    if result is not None:
        total = result.get("total")
        out.append(f"<p class='summary'>{len(result['hits'])} shown" + (f" of {total} matching" if total is not None else "")
                   + f" · {result['took_ms']:.1f} ms" + (" · filters: " + _e(" AND ".join(conditions)) if conditions else "")
                   + "</p>")
        out += [f"<p class='note'>{_e(n)}</p>" for n in result.get("notes", [])]
        qt = " ".join(f"{_e(t)}:{w:.2f}" for t, w in list(result.get("query_tokens", {}).items())[:12])
        out.append(f"<p class='qtokens'>query tokens: <code>{qt}</code></p>")
        if not result["hits"]:
            out.append("<p class='empty'>no hits</p>")
        out.append("<ol class='results'>")
        for rank, h in enumerate(result["hits"], 1):
            thumb = f"/v1/thumbnail/{quote(index, safe='')}/{quote(h['id'], safe='')}?size=256"
            heat = (f"<a class='heat' href='/v1/heatmap/{quote(index, safe='')}/{quote(h['id'], safe='')}?"
                    f"size=512&amp;q={quote(q, safe='')}' data-heat='1'>heatmap</a>") if stair else ""
            meta = " · ".join(f"{_e(k_)}={_e(_fmt(v))}" for k_, v in sorted((h.get("metadata") or {}).items()))
            ranks = h.get("retrievers") or {}
            why = (f" <span class='why' title='its rank by the words it carries, and by what the query means "
                   f"(cosine {_e(ranks['meaning'].get('score'))})'>words #{_e(ranks['sparse'].get('rank'))} · "
                   f"meaning #{_e(ranks['meaning'].get('rank'))}</span>") if {"sparse", "meaning"} <= ranks.keys() else ""
            out.append(f"<li class='hit' data-id='{_e(h['id'])}' data-score='{h['score']!r}'>"
                       f"<img class='thumb' src='{_e(thumb)}' alt='{_e(h.get('caption') or h['id'])}' loading='lazy' "
                       "width='256' height='256'>"
                       f"<div class='meta'><span class='rank'>{rank}.</span> <strong class='doc-id'>{_e(h['id'])}</strong>"
                       f" <span class='score'>score {h['score']:.4f}</span>{why}"
                       + (f"<div class='caption'>{_e(h['caption'])}</div>" if h.get("caption") else "")
                       + (f"<div class='md'>{meta}</div>" if meta else "")
                       + heat + "<div class='chips' aria-label='token contributions'></div></div></li>")
        out.append("</ol>")
    elif not q:
        out.append("<p class='hint'>Type what you are looking for; the score of each image is the dot product of "
                   "the query's token weights with the image's.</p>")
    payload = json.dumps(body).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    out.append(f"<script id='query' type='application/json'>{payload}</script>")
    out.append("<script src='/static/retry.js' defer></script><script src='/static/app.js' defer></script>"
               "</main></body></html>")
    return "".join(out)
