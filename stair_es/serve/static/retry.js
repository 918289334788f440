// stair-es results page: one request, asked again while the server says it is busy.
// A busy `stair-es serve` sheds work with 429 (or 503) and says when to come back (Retry-After-Ms,
// Retry-After); the page's explain calls and thumbnails go through here so that a busy moment
// delays them instead of losing them. This file knows HTTP and the server's retry headers, not the
// page (app.js draws what comes back). It loads in a browser (window.stairRetry) and in node
// (module.exports), where tests give it a fake fetch and a fake clock.
(function (root) {
  "use strict";

  // the statuses of a server that is busy or not ready yet: the answer says when to come back
  var BUSY = { 429: true, 503: true };
  var DEFAULTS = { tries: 7, baseMs: 100, maxMs: 10000 };

  // how long the server asked us to wait, in ms, or null: Retry-After-Ms (exact), else Retry-After (seconds)
  function serverDelayMs(response) {
    var ms = Number(response.headers.get("Retry-After-Ms"));
    if (response.headers.get("Retry-After-Ms") !== null && isFinite(ms) && ms >= 0) return ms;
    var s = response.headers.get("Retry-After");
    if (s !== null && /^\s*\d+(\.\d+)?\s*$/.test(s)) return Number(s) * 1000;
    return null;
  }

  // the wait before try `attempt + 1`: at least what the server asked, at least a back-off doubling from
  // baseMs (many clients told "1 ms" would otherwise all come back at once), at most maxMs, plus up to
  // half of it at random so that the page's own requests do not return together
  function waitMs(serverMs, attempt, opt, random) {
    var backoff = opt.baseMs * Math.pow(2, attempt - 1);
    var ms = Math.min(opt.maxMs, Math.max(serverMs === null ? 0 : serverMs, backoff));
    return Math.min(opt.maxMs, ms * (1 + 0.5 * random()));
  }

  function sleep(ms) { return new Promise(function (resolve) { setTimeout(resolve, ms); }); }

  // fetch(url, init), asked again (at most opt.tries times in all) while the answer is 429/503 or the
  // server cannot be reached. Resolves (never rejects) to
  //   {response: the last Response or null, tries: n, busy: the last answer was 429/503,
  //    error: the last network error or null}.
  // opt: tries, baseMs, maxMs; onRetry(attempt, ms, why) before each wait; and, for tests, fetch, sleep, random.
  function request(url, init, options) {
    var opt = {}, k;
    for (k in DEFAULTS) opt[k] = DEFAULTS[k];
    for (k in options || {}) opt[k] = options[k];
    var doFetch = opt.fetch || function (u, i) { return root.fetch(u, i); };
    var doSleep = opt.sleep || sleep, random = opt.random || Math.random;

    function attempt(n) {
      return Promise.resolve().then(function () { return doFetch(url, init); }).then(function (response) {
        var busy = !!BUSY[response.status];
        if (!busy || n >= opt.tries) return { response: response, tries: n, busy: busy, error: null };
        return again(n, waitMs(serverDelayMs(response), n, opt, random), "HTTP " + response.status);
      }, function (error) {
        if (n >= opt.tries) return { response: null, tries: n, busy: false, error: error };
        return again(n, waitMs(null, n, opt, random), String(error));
      });
    }

    function again(n, ms, why) {
      if (opt.onRetry) opt.onRetry(n, ms, why);
      return doSleep(ms).then(function () { return attempt(n + 1); });
    }

    return attempt(1);
  }

  // the server's one-line message of a failed answer ({"error": {"message": ...}}), or its status
  function errorMessage(response) {
    var fallback = "HTTP " + response.status + (response.statusText ? " " + response.statusText : "");
    return response.text().then(function (text) {
      try {
        var data = JSON.parse(text);
        return (data && data.error && data.error.message) || fallback;
      } catch (e) {
        return fallback;
      }
    }, function () { return fallback; });
  }

  var api = { request: request, errorMessage: errorMessage, serverDelayMs: serverDelayMs, DEFAULTS: DEFAULTS };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.stairRetry = api;
})(typeof window !== "undefined" ? window : globalThis);
