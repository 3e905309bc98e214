// The status page works without this script. It adds two things: an optional automatic
// reload (off by default, remembered in localStorage) and a running "updated N s ago".
(function () {
  "use strict";
  var box = document.getElementById("auto-refresh");
  var key = "quotaplane.status.refresh";
  if (box) {
    var seconds = parseInt(box.getAttribute("data-seconds"), 10) || 30;
    var timer = null;
    var arm = function () {
      if (timer) { clearTimeout(timer); timer = null; }
      if (box.checked) { timer = setTimeout(function () { location.reload(); }, seconds * 1000); }
    };
    try { box.checked = localStorage.getItem(key) === "on"; } catch (e) { /* storage off */ }
    box.addEventListener("change", function () {
      try { localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) { /* storage off */ }
      arm();
    });
    arm();
  }
  var stamp = document.querySelector("header.top time[data-ago]");
  if (stamp) {
    var at = Date.parse(stamp.getAttribute("datetime"));
    var label = stamp.textContent;
    var tick = function () {
      var s = Math.max(0, Math.round((Date.now() - at) / 1000));
      stamp.textContent = label + " (" + (s < 120 ? s + "s" : Math.round(s / 60) + "m") + " ago)";
    };
    if (!isNaN(at)) { tick(); setInterval(tick, 1000); }
  }
})();
