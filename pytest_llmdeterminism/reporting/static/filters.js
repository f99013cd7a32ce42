(function () {
  var active = "all", search = document.getElementById("search");
  var buttons = Array.prototype.slice.call(document.querySelectorAll(".filters button"));
  var rows = Array.prototype.slice.call(document.querySelectorAll("[data-groups]"));
  var names = buttons.map(function (button) { return button.getAttribute("data-filter"); });
  // The filter and the search live in the address (#filter=failed&search=Japan): a reload, the
  // back button or a link sent to a colleague opens the page as it was.
  function read() {
    var state = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var at = part.indexOf("=");
      if (at > 0) { state[part.slice(0, at)] = decodeURIComponent(part.slice(at + 1)); }
    });
    active = names.indexOf(state.filter) >= 0 ? state.filter : "all";
    search.value = state.search || "";
  }
  function write() {
    var parts = [];
    if (active !== "all") { parts.push("filter=" + encodeURIComponent(active)); }
    if (search.value) { parts.push("search=" + encodeURIComponent(search.value)); }
    var hash = parts.length ? "#" + parts.join("&") : "";
    if (hash !== location.hash) {
      history.replaceState(null, "", location.pathname + location.search + hash);
    }
  }
  function apply() {
    var text = search.value.trim().toLowerCase(), shown = 0;
    rows.forEach(function (row) {
      var visible = row.getAttribute("data-groups").split(" ").indexOf(active) >= 0 &&
        (!text || row.getAttribute("data-search").toLowerCase().indexOf(text) >= 0);
      row.hidden = !visible;
      if (visible) { shown += 1; }
    });
    buttons.forEach(function (button) {
      button.setAttribute("aria-pressed", String(button.getAttribute("data-filter") === active));
    });
    document.getElementById("shown").textContent = shown + " of " + rows.length + " shown";
    write();
  }
  buttons.forEach(function (button) {
    button.addEventListener("click", function () { active = button.getAttribute("data-filter"); apply(); });
  });
  search.addEventListener("input", apply);
  window.addEventListener("hashchange", function () { read(); apply(); });
  read();
  apply();
})();
