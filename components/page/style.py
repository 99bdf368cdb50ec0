"""The page's own CSS and script (`launch_kwargs` passes both to `launch`): where the areas sit, and the
few things Gradio's widgets do not do by themselves.

Wide screens (over 768 px): the inputs, then the results, in the main column; the controls in a narrow
column beside both, sticky (it stays on screen, scrolling inside itself when taller than the screen),
so a slider and the panels it moves are in view together wherever the page is scrolled. Phones (one
column): inputs, then the results, then the controls, so the panels come right after Run and its
examples instead of below every control (a grid: the areas are placed, the page order stays inputs,
controls, results); there the controls stay in reach while the panels are on screen: a sheet fixed to
the bottom of the screen (a third of its height; the page gets as much room below its end). Either
column of controls scrolls vertically only: its widgets stack in one column at its width (Gradio's rows
wrap; nothing wider than the column, no list scrolled inside it; on a phone the budget first), and it
sits above everything the panels draw (their labels and full-screen / download buttons are positioned:
without a stacking context of its own the sheet lost taps to them). A clicked patch's PMI box sits under
the panel's kept-patch image (#panel-N-patch).

Nothing a panel draws is hidden by Gradio's overlays: a panel picture's label and buttons sit in a strip
above the picture (the picture starts under them), and the per-frame chart has neither.
"""
from __future__ import annotations

# the controls' column stacks its widgets (shared by the desktop column and the phone sheet)
_STACKED = """
  #controls-col { overflow-y: auto; overflow-x: hidden; overscroll-behavior: contain; box-sizing: border-box;
                  display: flex !important; flex-direction: column !important; flex-wrap: nowrap !important; }
  #controls-col > * { flex: 0 0 auto !important; width: 100% !important; min-width: 0 !important;
                      max-width: 100% !important; }
  #controls-col .form { flex-wrap: nowrap !important; height: auto !important; }
  #controls-col .row, #controls-col .row > .form { flex-wrap: wrap !important; }
  #controls-col .row > *, #controls-col .row > .form > * { min-width: min(140px, 100%) !important; }
  #controls-col .wrap, #controls-col fieldset { max-height: none !important; overflow: visible !important; }
  #controls-col > .row:has(#budget) { order: -1; }  /* the budget first: the control moved most */
  #controls-col .row:has(#budget) > * { min-width: 100% !important; }  /* the slider at the column's width */
"""

PANEL_STRIP_PX = 30  # the strip above a panel picture that its label and buttons take

LAYOUT_CSS = """
#layout { display: grid !important; grid-template-columns: minmax(0, 1fr) minmax(250px, 280px); column-gap: 12px;
          grid-template-areas: "inputs controls" "results controls"; align-items: start; }
#inputs-col { grid-area: inputs; } #controls-col { grid-area: controls; } #results-col { grid-area: results; }
#layout > div { min-width: 0 !important; }
#controls-hint { display: none; }
/* Gradio's container hides its overflow, which makes it the sticky column's scroll box (it never sticks):
   clip cuts the same overflow without being one. (Outside @media: Gradio scopes the rules inside one to
   elements within its container.) */
.gradio-container { overflow: clip !important; }
@media (min-width: 769px) {
  #controls-col { position: sticky !important; top: 8px; max-height: calc(100vh - 16px); align-self: start;
                  z-index: 1000; isolation: isolate; padding-right: 4px; }
""" + _STACKED + """
}
@media (max-width: 768px) {
  #layout { grid-template-columns: minmax(0, 1fr); grid-template-areas: "inputs" "results" "controls"; }
  #controls-col { position: fixed !important; left: 0; right: 0; bottom: 0; z-index: 1000; isolation: isolate;
                  max-height: 34vh; width: 100vw !important; padding: 4px 8px;
                  background: var(--background-fill-primary); border-top: 2px solid var(--color-accent);
                  box-shadow: 0 -4px 12px #0003; }
""" + _STACKED + """
  #controls-hint { order: -2; }
  #controls-hint { display: block; margin: 0; padding: 0 4px; font-size: 0.8em; }
  #layout { margin-bottom: 36vh; }  /* room under the page's end for the sheet */
}
/* Run scrolls the status line to the top: as it and the panels fill in, the browser's scroll anchoring
   would keep a node under them in place and push the status line off the screen */
#results-col { overflow-anchor: none; }
#status { scroll-margin-top: 8px; }  /* Run scrolls it into view with a little room above */
/* a panel picture starts under its label and buttons; a picture swapped in shows once it has loaded */
[id^="panel-"] .image-frame { padding-top: %dpx; box-sizing: border-box; }
[id^="panel-"] img[data-swapping] { visibility: hidden; }
""" % PANEL_STRIP_PX

# Run when the page loads (`launch(js=...)`):
# - a panel picture whose source changes is hidden until the new one has loaded (or failed): the browser
#   would otherwise keep drawing the old picture (another method's, after the methods changed) under the
#   new title meanwhile;
# - `window.mipExample` counts example loads under way (the examples' click and its last step set it,
#   components.page.inputs); Run and Enter wait for it (RUN_WAIT_JS) before they read the inputs.
PAGE_JS = """() => {
  window.mipExample = window.mipExample || 0;
  const hide = (img) => {
    if (img.complete && img.naturalWidth > 0) { img.removeAttribute('data-swapping'); return; }
    img.setAttribute('data-swapping', '');
    const done = () => img.removeAttribute('data-swapping');
    img.addEventListener('load', done, {once: true});
    img.addEventListener('error', done, {once: true});
  };
  new MutationObserver((records) => {
    for (const r of records) {
      const nodes = r.type === 'attributes' ? [r.target] : [...r.addedNodes];
      for (const n of nodes) {
        if (!(n instanceof Element) || !n.closest('[id^="panel-"]')) continue;
        for (const img of n.tagName === 'IMG' ? [n] : n.querySelectorAll('img')) hide(img);
      }
    }
  }).observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ['src']});
}"""

# Before Run (or Enter in the prompt) reads the inputs: wait (at most 60 s) while an example is loading,
# so Run encodes the example clicked, not the empty inputs before it arrives.
RUN_WAIT_JS = """async () => {
  const t0 = performance.now();
  while ((window.mipExample || 0) > 0 && performance.now() - t0 < 60000) await new Promise((r) => setTimeout(r, 50));
}"""

# The examples' click, in the page before the server loads it: one more load under way (shown on the Run
# button and in Gradio's progress on the inputs it fills); EXAMPLE_DONE_JS when it has arrived.
EXAMPLE_START_JS = """(i) => { window.mipExample = (window.mipExample || 0) + 1; return i; }"""
EXAMPLE_DONE_JS = """() => { window.mipExample = Math.max(0, (window.mipExample || 0) - 1); }"""

__all__ = ["EXAMPLE_DONE_JS", "EXAMPLE_START_JS", "LAYOUT_CSS", "PAGE_JS", "PANEL_STRIP_PX", "RUN_WAIT_JS"]
