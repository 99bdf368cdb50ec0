"""Re-check that the tests catch the bugs they were written for (issue 48, "Tests that catch what they claim").

Each mutation is a bug made by hand: one text replacement in one file, found by its text (not a line
number, so it follows the code when it moves). The script applies one, runs the test that must catch
it, expects that test to FAIL, and puts the file back, whatever happens. Not part of the suite (pytest
does not collect this file); run it from the repository root:

    python tests/mutations.py            # every mutation; exit 1 when one survives or no longer applies
    python tests/mutations.py rows warm  # those whose name starts with these words

A mutation whose text is no longer in its file is reported as "gone" (the code changed: move the
mutation with it). The table of mutations and catching tests is in docs/architecture.md ("Tests").
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, file, text, replaced by, the test that must fail)
MUTATIONS = [
    ("head-timer-reset-by-data", "components/hosting/server.py",
     "            super().data_received(data)\n            self._follow_head()",
     "            super().data_received(data)\n            self._stop_timer()\n            self._follow_head()",
     "tests/app/test_hosted_heads.py::test_a_head_sent_a_byte_at_a_time_is_closed_before_it_ends"),
    ("connections-uncapped", "components/hosting/server.py",
     "if max_client_connections and open_by_address[self.address] > max_client_connections:", "if False:",
     "tests/app/test_hosted_heads.py::test_an_address_has_a_bounded_number_of_connections"),
    ("kept-not-read", "components/page/calls.py", 'v["state"] = kept.state(session, v["state"])',
     'kept.state(session, None)', "tests/app/test_hosted_sessions.py::test_throw_away_sessions_evict_no_visitor_who_encoded"),
    ("rows-boundary", "mipruner/models/common/rows.py", "lengths[i] >= RATIO * head", "lengths[i] > RATIO * head",
     "tests/models/test_row_masks.py::test_a_row_on_the_ratio_boundary_joins_the_group"),
    ("warm-top-bucket", "mipruner/serve/warm_up.py", "range(1, int(rows) + 1)", "range(1, int(rows))",
     "tests/test_warm_buckets.py::test_buckets_are_a_fixed_set"),
    ("sweep-no-lock", "components/core/sweep_logic.py", "lock=engine.model_lock)", "lock=None)",
     "tests/app/test_sweep_lock.py"),
    ("warm-batch-unlocked", "mipruner/serve/warm_up.py",
     "            with lock:\n                adapter.generate_batch(", "            if True:\n                adapter.generate_batch(",
     "tests/test_warm_lock.py"),
    ("turns-fifo", "mipruner/serve/turns.py", "        if line:\n            self._ring.append(key)", "        if line:\n            self._ring.appendleft(key)",
     "tests/test_turns.py::test_a_flooders_queue_does_not_go_before_another_sessions_request"),
    ("turns-key-by-object", "mipruner/serve/turns.py",
     "        return label(owner)", "        return 0 if owner is None else id(owner)",
     "tests/test_turns.py::test_one_connection_is_one_line_whatever_string_object_names_it"),
    ("panel-file-rewritten", "components/core/panel_files.py",
     "saved = written(img, cache, fmt) if cache and fmt else img", "saved = img",
     "tests/app/test_panel_files.py::test_a_file_there_already_is_never_written_again"),
    ("stream-no-heartbeat", "components/core/answers.py", "reports.get(timeout=HEARTBEAT_S)", "reports.get()",
     "tests/app/test_answer_cancel.py"),
    ("files-hold-alone", "mipruner/serve/files.py", "if nbytes > self.max_bytes - self.held:", "if nbytes > self.max_bytes:",
     "tests/test_file_holds.py"),
    ("files-prune-ignores-holds", "mipruner/serve/files.py",
     "                if self._used + self.held + room <= self.max_bytes:\n                    return 0",
     "                if self._used + room <= self.max_bytes:\n                    return 0",
     "tests/test_file_holds.py"),
    ("paths-tolerance-x1000", "tests/paths.py", "return ulps * torch.finfo", "return 1000 * ulps * torch.finfo",
     "tests/test_paths.py"),
    ("mi-minmax-snap", "mipruner/pruners/mi.py",
     "    diff = torch.where(diff > noise[:, None], diff, torch.zeros_like(diff))\n", "",
     "tests/pruners/test_mi.py::test_minmax_entries_a_few_ulps_above_the_row_minimum_are_the_minimum"),
    ("shares-by-tokens", "mipruner/serve/answer_time.py", "flops = [row_prefill_flops(adapter.config, a.input_tokens) for a in answers]",
     "flops = [a.input_tokens for a in answers]", "tests/test_answer_time.py::test_split_and_labels"),
    ("mask-first-token-steps", "mipruner/models/common/rows.py", ">= (width - lengths)[:, None]",
     "> (width - lengths)[:, None]", "tests/models/test_row_masks.py"),
    ("mask-first-token-prefill", "mipruner/models/common/path.py", "mask[i, width - n:] = 1",
     "mask[i, width - n + 1:] = 1", "tests/models/test_row_masks.py"),
    ("mask-first-new-token", "mipruner/models/common/greedy.py", "mask = torch.cat([mask, mask.new_ones(n_rows, 1)], dim=1)",
     "mask = torch.cat([mask, mask.new_ones(n_rows, 1) if n > 1 else mask.new_zeros(n_rows, 1)], dim=1)",
     "tests/models/test_row_masks.py"),
    ("zerogpu-empty-session", "mipruner/serve/session.py", '        state["budget"] = None\n',
     '        state["budget"] = None\n        state["entries"] = type(self.entries)()\n',
     "tests/app/test_zerogpu.py::test_a_session_pickles_with_its_entries_without_its_lock_and_cap"),
    ("compute-table-share", "mipruner/eval/runner.py", "else f\"{100 * r['flops']:.1f}%\"", "else f\"{r['flops']:.1f}%\"",
     "tests/test_compute.py::test_equal_compute_picks_the_closest_budget"),
    ("equal-compute-first-only", "mipruner/eval/runner.py", "tried, tied = [pick], same_compute(tried, pick)",
     "tried, tied = [pick], []", "tests/test_compute.py::test_equal_compute_names_every_budget_of_the_same_compute"),
    ("inline-unchecked", "mipruner/pruners/_registry.py", "return bool(self.origin) or not self.builtin",
     "return bool(self.origin)", "tests/test_inline_contract.py::test_inline_and_plugin_methods_are_checked_alike"),
]


def run(name: str, path: str, old: str, new: str, test: str) -> str:
    full = os.path.join(ROOT, path)
    with open(full) as f:
        original = f.read()
    if original.count(old) != 1:
        return "gone"
    try:
        with open(full, "w") as f:
            f.write(original.replace(old, new))
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    finally:
        with open(full, "w") as f:
            f.write(original)
    return "caught" if rc == 1 else ("SURVIVED" if rc == 0 else f"error (pytest exit {rc})")


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not argv or any(m[0].startswith(a) for a in argv)]
    bad = 0
    for name, path, old, new, test in chosen:
        verdict = run(name, path, old, new, test)
        bad += verdict != "caught"
        print(f"{name:28s} {verdict:10s} {test}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
