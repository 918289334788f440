// stair-es results page: adds per-hit token chips with contribution bars from POST /v1/explain, and
// keeps the thumbnails shown when the server is busy. The result list itself is rendered by the server
// and works without this script. Requests go through retry.js: an answer 429/503 (the server shed the
// request) is asked again after the server's Retry-After, a bounded number of times, and only then is
// a failure shown, saying why.
(function () {
  "use strict";
  var node = document.getElementById("query");
  if (!node) return;
  var query = JSON.parse(node.textContent || "{}");
  if (!query.index) return;
  var retry = window.stairRetry;
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

  // why a request finally failed, in words a user can act on
  function failure(res, what) {
    if (!res.response) return Promise.resolve(what + " failed: the server could not be reached (" + res.error + ")");
    return retry.errorMessage(res.response).then(function (msg) {
      if (!res.busy) return what + " failed: " + msg;
      return what + " failed: the server stayed busy after " + res.tries + " tries (" + msg + "); reload the page to try again";
    });
  }

  function draw(li, box, data) {
    box.textContent = "";
    box.className = "chips";
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
  }

  function showError(box, message) {
    box.textContent = message;
    box.className = "chips error";
    box.setAttribute("role", "alert");
  }

  // resolves once the hit shows its chips or says why it cannot
  function explain(li) {
    var box = li.querySelector(".chips");
    var body = Object.assign({}, query, { id: li.dataset.id });
    var init = { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
    function waiting() { box.textContent = "the server is busy; asking again\u2026"; box.className = "chips pending"; }
    return retry.request("/v1/explain", init, { onRetry: waiting }).then(function (res) {
      if (res.response && res.response.ok) {
        return res.response.json().then(function (data) { draw(li, box, data); });
      }
      return failure(res, "explain").then(function (msg) { showError(box, msg); });
    }).catch(function (e) { showError(box, "explain failed: " + e); });
  }

  // A thumbnail the browser could not load is asked for again through retry.js, which sees the status
  // an <img> hides: 429/503 (busy) are retried and the image shown from the bytes that finally came
  // (a data: URL, so no further request can be shed); 404 is a document without an image under the
  // server's image roots ("no thumbnail", as before); anything else, or a server busy for every try,
  // leaves a note saying why. img.dataset.state ends "loaded", "none" or "failed".
  function note(li, img, text) {
    var el = li.querySelector(".thumb-note");
    if (!el) {
      el = document.createElement("div");
      el.className = "thumb-note";
      el.setAttribute("role", "status");
      img.insertAdjacentElement("afterend", el);
    }
    el.textContent = text;
  }

  function asDataURL(blob) {
    return new Promise(function (resolve, reject) {
      var reader = new FileReader();
      reader.onload = function () { resolve(reader.result); };
      reader.onerror = function () { reject(reader.error); };
      reader.readAsDataURL(blob);
    });
  }

  function watchImage(li, img) {
    img.dataset.want = img.getAttribute("src");
    function loaded() {
      if (img.naturalWidth > 0) {
        img.dataset.state = "loaded";
        img.classList.remove("missing");
        var n = li.querySelector(".thumb-note");
        if (n) n.remove();
      }
    }
    function recover() {
      var url = img.dataset.want;
      if (img.dataset.state === "retrying") return;
      if ((img.getAttribute("src") || "").indexOf("data:") === 0) {  // the bytes came but do not decode
        img.classList.add("missing");
        img.dataset.state = "failed";
        return note(li, img, "thumbnail failed: the browser cannot decode the image the server sent");
      }
      img.dataset.state = "retrying";
      retry.request(url, {}, {}).then(function (res) {
        if (img.dataset.want !== url) return;  // the heatmap link switched the picture meanwhile
        if (res.response && res.response.ok) {
          return res.response.blob().then(asDataURL).then(function (data) { img.dataset.state = "loading"; img.src = data; });
        }
        if (res.response && res.response.status === 404) {
          return retry.errorMessage(res.response).then(function (msg) {
            img.classList.add("missing");
            img.alt = "no thumbnail";
            img.title = msg;
            img.dataset.state = "none";
          });
        }
        return failure(res, "thumbnail").then(function (msg) {
          img.classList.add("missing");
          img.alt = msg;
          img.dataset.state = "failed";
          note(li, img, msg);
        });
      }).catch(function (e) {
        img.dataset.state = "failed";
        note(li, img, "thumbnail failed: " + e);
      });
    }
    img.addEventListener("load", loaded);
    img.addEventListener("error", recover);
    // the browser may have tried it before this (deferred) script ran
    if (img.complete && img.getAttribute("src")) {
      if (img.naturalWidth > 0) loaded();
      else recover();
    }
    return function show(url) {  // for the heatmap link
      img.dataset.want = url;
      img.dataset.state = "loading";
      img.src = url;
    };
  }

  var hits = Array.prototype.slice.call(document.querySelectorAll("li.hit"));
  hits.forEach(function (li) {
    var img = li.querySelector("img.thumb");
    if (!img) return;
    var plain = img.getAttribute("src");
    var show = watchImage(li, img);
    // STAIR indices: the heatmap link toggles the localisation overlay on the thumbnail (without
    // JavaScript it is a plain link to the PNG)
    var link = li.querySelector("a.heat");
    if (!link) return;
    link.addEventListener("click", function (ev) {
      ev.preventDefault();
      var on = li.classList.toggle("heat-on");
      show(on ? link.getAttribute("href") : plain);
      link.textContent = on ? "hide heatmap" : "heatmap";
    });
  });
  // a few at a time: the server's worker pool is small; "explained" once every hit shows its chips
  // or the reason it has none
  var i = 0;
  function next() {
    if (i >= hits.length) { document.body.dataset.explained = "1"; return; }
    var batch = hits.slice(i, i + 4);
    i += 4;
    Promise.all(batch.map(explain)).then(next);
  }
  next();
})();
