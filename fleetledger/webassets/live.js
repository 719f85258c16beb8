// fleetledger web: keeps #view current without a reload. Every 500 ms it asks for the view's
// fragment with the digest it shows (?v=); 204 means unchanged, 200 brings the new fragment,
// which replaces the old one. Focus stays on the element (by id) that had it.
(function () {
  "use strict";
  var region = document.getElementById("view");
  var status = document.getElementById("live-status");
  if (!region || !region.dataset.live) {
    return;
  }
  var busy = false;

  function digest() {
    var root = region.firstElementChild;
    return root ? root.getAttribute("data-digest") || "" : "";
  }

  function say(text, stale) {
    if (status) {
      status.textContent = text;
      status.classList.toggle("stale", stale);
    }
  }

  function swap(html) {
    var focused = document.activeElement && region.contains(document.activeElement)
      ? document.activeElement.id : "";
    var template = document.createElement("template");
    template.innerHTML = html;
    region.replaceChildren(template.content);
    if (focused) {
      var again = document.getElementById(focused);
      if (again) {
        again.focus();
      }
    }
  }

  function tick() {
    if (busy) {
      return;
    }
    busy = true;
    var url = region.dataset.live + "?v=" + encodeURIComponent(digest());
    fetch(url, { cache: "no-store", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (response.status === 204) {
          return null;
        }
        if (!response.ok) {
          return response.text().then(function (text) {
            throw new Error(text || response.status + " " + response.statusText);
          });
        }
        return response.text();
      })
      .then(function (html) {
        if (html !== null) {
          swap(html);
          say("Live: updated at " + new Date().toLocaleTimeString() + ".", false);
        } else if (status && status.classList.contains("stale")) {
          say("Live: up to date again.", false);
        }
      })
      .catch(function (error) {
        say("Not updating: " + error.message + " (retrying).", true);
      })
      .finally(function () {
        busy = false;
      });
  }

  window.setInterval(tick, 500);
})();
