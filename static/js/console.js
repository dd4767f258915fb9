// The console's little script (a file of its own: the CSP allows no inline code).
// Messages stay until dismissed: refreshes never touch the #messages region.
document.addEventListener("click", (event) => {
  const button = event.target.closest(".messages .dismiss");
  if (button) button.closest(".message").remove();
});

// A job's live log (templates/jobs/log.html): it opens at its end; a reader at its end
// stays there as lines come, and one who scrolled up stays where they read.
const logBoxes = new Set();
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("pre.log").forEach((box) => { box.scrollTop = box.scrollHeight; });
});
document.addEventListener("htmx:beforeSwap", (event) => {
  const box = event.detail.target.closest("pre.log");
  if (box && box.scrollHeight - box.scrollTop - box.clientHeight < 24) logBoxes.add(box);
});
document.addEventListener("htmx:afterSettle", () => {
  logBoxes.forEach((box) => { box.scrollTop = box.scrollHeight; });
  logBoxes.clear();
});
