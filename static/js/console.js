// The console's little script (a file of its own: the CSP allows no inline code).
// Messages stay until dismissed: refreshes never touch the #messages region.
document.addEventListener("click", (event) => {
  const button = event.target.closest(".messages .dismiss");
  if (button) button.closest(".message").remove();
});
