"""Unmodified vLLM's greedy tokens, in a process of its own with every plug-in off (VLLM_PLUGINS="").

Usage: python stock_vllm.py REQUESTS.json OUT.json; REQUESTS: {"model": path, "max_tokens": n,
"limits": limit_mm_per_prompt, "requests": [{"prompt": str, "image": [width, height, seed]} or
{"prompt": str, "video": [frames, width, height, seed]}]}. OUT: a list of token-id lists.
"""
import json
import os
import sys

os.environ["VLLM_PLUGINS"] = ""
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

sys.path.insert(0, os.path.dirname(__file__))
from images import image, video  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

spec = json.load(open(sys.argv[1]))
llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=512,
          distributed_executor_backend="uni", seed=0, limit_mm_per_prompt=spec.get("limits", {"image": 2, "video": 0}))
sp = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], min_tokens=spec["max_tokens"], ignore_eos=True)
outs = llm.generate([{"prompt": r["prompt"], "multi_modal_data": ({"image": image(*r["image"])} if "image" in r
                                                                  else {"video": video(*r["video"])})}
                     for r in spec["requests"]], sp)
json.dump([list(o.outputs[0].token_ids) for o in outs], open(sys.argv[2], "w"))
