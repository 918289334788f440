// stair-es results page: adds per-hit token chips with contribution bars from POST /v1/explain.
// The result list itself is rendered by the server and works without this script.
(function () {
  "use strict";
  var node = document.getElementById("query");
  if (!node) return;
  var query = JSON.parse(node.textContent || "{}");
  if (!query.index) return;
  var CHIPS = 8;

  function chip(c, score) {
    var el = document.createElement("span");
    el.className = "chip";
    el.dataset.token = c.token;
    el.dataset.field = c.field;
    el.dataset.contribution = String(c.contribution);
    el.title = c.field + ": query " + c.query_weight.toFixed(3) + " \u00d7 doc " + c.doc_weight.toFixed(3) +
      " = " + c.contribution.toFixed(4);
    var label = document.createElement("span");
    label.className = "label";
    label.textContent = c.token + (c.field === "image" ? "" : " (" + c.field + ")");
    var bar = document.createElement("span");
    bar.className = "bar";
    var share = score > 0 ? Math.max(0, Math.min(1, c.contribution / score)) : 0;
    bar.dataset.share = String(share);
    bar.style.width = (share * 100).toFixed(2) + "%";
    var value = document.createElement("span");
    value.className = "value";
    value.textContent = c.contribution.toFixed(3);
    el.appendChild(label);
    el.appendChild(bar);
    el.appendChild(value);
    return el;
  }

  function explain(li) {
    var body = Object.assign({}, query, { id: li.dataset.id });
    return fetch("/v1/explain", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body)
    }).then(function (r) { return r.json().then(function (data) { return [r.ok, data]; }); })
      .then(function (res) {
        var box = li.querySelector(".chips");
        if (!res[0]) {
          box.textContent = (res[1].error && res[1].error.message) || "explain failed";
          box.className = "chips error";
          return;
        }
        var data = res[1];
        box.dataset.score = String(data.score);
        data.contributions.slice(0, CHIPS).forEach(function (c) { box.appendChild(chip(c, data.score)); });
        var rest = data.contributions.length - CHIPS;
        if (rest > 0) {
          var more = document.createElement("span");
          more.className = "more";
          more.textContent = "+" + rest + " more";
          box.appendChild(more);
        }
        li.classList.add("explained");
      })
      .catch(function (e) { li.querySelector(".chips").textContent = "explain failed: " + e; });
  }

  var hits = Array.prototype.slice.call(document.querySelectorAll("li.hit"));
  // STAIR indices: the heatmap link toggles the localisation overlay on the thumbnail (without
  // JavaScript it is a plain link to the PNG)
  hits.forEach(function (li) {
    var link = li.querySelector("a.heat");
    var img = li.querySelector("img.thumb");
    if (!link || !img) return;
    var plain = img.src;
    link.addEventListener("click", function (ev) {
      ev.preventDefault();
      var on = li.classList.toggle("heat-on");
      img.src = on ? link.href : plain;
      link.textContent = on ? "hide heatmap" : "heatmap";
    });
  });
  // a document whose image is not under the server's image roots has no thumbnail: say so
  hits.forEach(function (li) {
    var img = li.querySelector("img.thumb");
    if (!img) return;
    function missing() { img.classList.add("missing"); img.alt = "no thumbnail"; }
    img.addEventListener("error", missing);
  });
  // a few at a time: the server's worker pool is small
  var i = 0;
  function next() {
    if (i >= hits.length) { document.body.dataset.explained = "1"; return; }
    var batch = hits.slice(i, i + 4);
    i += 4;
    Promise.all(batch.map(explain)).then(next);
  }
  next();
})();
