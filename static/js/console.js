// The console's little script (a file of its own: the CSP allows no inline code).
// Messages stay until dismissed: refreshes never touch the #messages region.
document.addEventListener("click", (event) => {
  const button = event.target.closest(".messages .dismiss");
  if (button) button.closest(".message").remove();
});

// A job's live log (jobs/templates/jobs/log.html): it opens at its end; a reader at its end
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

// "Pause updates" (WCAG 2.2.2): shown where something refreshes itself (hx-trigger
// "every …"); while pressed, those refreshes are not sent. Remembered per tab
// (sessionStorage), so it holds across the pages of one tab.
const PAUSED = "lakeshore.updates-paused";
const updatesPaused = () => sessionStorage.getItem(PAUSED) === "yes";
document.addEventListener("DOMContentLoaded", () => {
  const button = document.getElementById("pause-updates");
  if (!button || !document.querySelector('[hx-trigger^="every"]')) return;
  button.hidden = false;
  button.setAttribute("aria-pressed", String(updatesPaused()));
  button.addEventListener("click", () => {
    const pause = !updatesPaused();
    sessionStorage.setItem(PAUSED, pause ? "yes" : "no");
    button.setAttribute("aria-pressed", String(pause));
  });
});
document.addEventListener("htmx:beforeRequest", (event) => {
  const trigger = event.detail.elt.getAttribute("hx-trigger") || "";
  if (updatesPaused() && trigger.startsWith("every")) event.preventDefault();
});

// A refresh keeps the keyboard focus. Before htmx swaps a box that holds the focus, note
// which control has it: its id, or else its tag, address, name and text and which of the
// box's controls alike it is; after the swap, the same control in the new box takes it.
let focusNote = null;
const focusKey = (el) =>
  [el.tagName, el.getAttribute("href"), el.getAttribute("name"), el.textContent.trim()].join("\n");
document.addEventListener("htmx:beforeSwap", (event) => {
  const active = document.activeElement;
  const box = event.detail.target;
  if (!active || active === document.body || !box.contains(active)) return;
  const key = focusKey(active);
  const alike = [...box.querySelectorAll(active.tagName)].filter((el) => focusKey(el) === key);
  focusNote = { id: active.id, key, index: alike.indexOf(active), tag: active.tagName, box: box.id };
});
document.addEventListener("htmx:afterSettle", () => {
  const note = focusNote;
  focusNote = null;
  if (!note || (document.activeElement && document.activeElement !== document.body)) return;
  let found = note.id ? document.getElementById(note.id) : null;
  const box = note.box ? document.getElementById(note.box) : null;
  if (!found && box) {
    const alike = [...box.querySelectorAll(note.tag)].filter((el) => focusKey(el) === note.key);
    found = alike[note.index] || null;
  }
  if (found) found.focus({ preventScroll: true });
});
