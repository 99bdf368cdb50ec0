"""The input column: model choice, image / video (the "use" radio picks one and shows its input alone),
prompt (Enter runs it), Run, and the examples (Run waits for one being loaded)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ..core.examples import EXAMPLES_DIR, load_examples
from ..core.views import FEWER_LABEL
from . import style as S


@dataclass
class Inputs:
    model: gr.Dropdown
    model_path: gr.Textbox
    image: gr.Image
    video: gr.Video
    use: gr.Radio
    prompt: gr.Textbox
    run: gr.Button
    fewer: gr.Checkbox  # read an image as 1 view (anyres models): ticked on CPU hardware, hidden on a GPU

    def encode_inputs(self) -> list:
        """What /encode reads, in its order (after the state)."""
        return [self.model, self.model_path, self.use, self.image, self.video, self.prompt]


def build_inputs(hub, fewer: bool = False) -> Inputs:
    """The widgets of the input column (call inside a gr.Column); fewer: the app runs on a CPU
    (`components.core.views.fewer_by_default`): the "Fewer views for speed" box shown, ticked."""
    model = gr.Dropdown(hub.choices(), value=hub.default, allow_custom_value=True, elem_id="model", label="Model")
    model_path = gr.Textbox(label="...or a model id / local path (used instead of the list when given)",
                            placeholder="e.g. llava-hf/llava-1.5-7b-hf or /models/my-llava", elem_id="model-path")
    gr.Markdown(hub.startup_message or "", elem_id="model-status")
    # one source of truth for the medium: "use" picks it and shows its input alone (Run encodes what shows)
    use = gr.Radio(["image", "video"], value="image", label="Use", elem_id="use")
    # image_mode=None: Gradio hands the uploaded file on as it is; its default ("RGB") would decode and
    # re-save a non-RGB upload, in the format the payload's name says, before any size check.
    # `mipruner.media.load_image` reads the size from the header and refuses a bomb before decoding.
    image = gr.Image(type="filepath", image_mode=None, sources=["upload", "clipboard", "webcam"], label="Image",
                     elem_id="image", height=300)
    video = gr.Video(sources=["upload"], label="Video (a few frames are sampled)", elem_id="video", height=300,
                     visible=False)
    # one line at start (growing to 4 as it wraps): there Enter runs the prompt instead of adding a line
    prompt = gr.Textbox(label="Prompt (Enter runs it)", placeholder="Ask a question about the image or video",
                        elem_id="prompt", lines=1, max_lines=4)
    run = gr.Button("Run", variant="primary", elem_id="run")
    fewer_box = gr.Checkbox(value=fewer, visible=fewer, label=FEWER_LABEL, elem_id="fewer-views",
                            info="On this CPU, LLaVA-OneVision reads an image as 1 view instead of its 5 or so "
                                 "(base view + tiles): a faster first result; untick it to read them all")
    quiet = dict(api_visibility="private", queue=False, show_progress="hidden")
    examples = load_examples()
    if examples:
        # served from the package as they are, never copied into the upload cache (which the files cap
        # prunes): a thumbnail or an example loaded into an input is the file under assets/examples
        gr.set_static_paths([EXAMPLES_DIR])
        # two columns (a thumbnail, the prompt) fit a phone: a video shows its poster, and a click
        # loads the file into its own input and sets "use" (which shows that input)
        table = gr.Dataset(components=["image", "textbox"], headers=["", "prompt"], type="index", elem_id="examples",
                           samples=[[e["thumb"], e["prompt"] + (" (video)" if e["kind"] == "video" else "")]
                                    for e in examples],
                           label="Examples (generated scenes and a clip; the embedded model knows these shapes)")

        def load(i):
            e = examples[i]
            return (e["path"] if e["kind"] == "image" else None, e["path"] if e["kind"] == "video" else None,
                    e["prompt"], e["kind"])

        # the page counts the load under way (Run waits for it: components.page.style) and Gradio's progress
        # shows on the inputs it fills from the click on
        table.click(load, table, [image, video, prompt, use], js=S.EXAMPLE_START_JS, api_visibility="private",
                    queue=False, show_progress="full", show_progress_on=[image, video, prompt]).then(
            None, None, None, js=S.EXAMPLE_DONE_JS, **quiet)
    image.upload(lambda: "image", None, use, **quiet)
    video.upload(lambda: "video", None, use, **quiet)
    # an example, an upload or a click on "use" shows that medium's input and hides the other
    use.change(lambda kind: (gr.update(visible=kind != "video"), gr.update(visible=kind == "video")), use,
               [image, video], **quiet)
    return Inputs(model, model_path, image, video, use, prompt, run, fewer_box)


__all__ = ["Inputs", "build_inputs"]
