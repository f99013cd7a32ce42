(function () {
  var active = "all", search = document.getElementById("search");
  var buttons = Array.prototype.slice.call(document.querySelectorAll(".filters button"));
  var rows = Array.prototype.slice.call(document.querySelectorAll("[data-groups]"));
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
  }
  buttons.forEach(function (button) {
    button.addEventListener("click", function () { active = button.getAttribute("data-filter"); apply(); });
  });
  search.addEventListener("input", apply);
  apply();
})();
