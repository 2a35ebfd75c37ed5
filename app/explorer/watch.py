"""Results as they land: while a main job under the results root runs, a fragment re-reads its ``main_job.json``
every :data:`POLL_S` seconds (``st.fragment(run_every=...)``: only the fragment reruns, not the page) and, when a
study has finished (:func:`app.explorer.jobs.landed` changed), forgets the cached listing of the results and
reruns the page — the new result shows without "Reload results". With no job running nothing polls."""

from __future__ import annotations

import streamlit as st

from app.explorer import data, jobs
from app.explorer.paths import UnsafePathError
from app.explorer.state import get_roots
from app.explorer.ui import clock

POLL_S = 3.0
_SEEN = "lens-jobs-landed"  # session key: what had finished when the page last ran in full


def _read() -> list[dict]:
    try:
        return data.read_job_states(get_roots().results)
    except UnsafePathError:
        return []


def _clock(seconds) -> str:
    return "?" if seconds is None else clock(seconds)


def job_panel(detail: bool) -> bool:
    """Each running main job: one line (``detail=False``, the sidebar) or a line, a progress bar and a row per
    study (the Overview); the page reruns when one of its studies finishes. A stopped job (Ctrl-C, SIGTERM) is
    said once, with how to go on. True when a job is running."""
    found = _read()
    st.session_state[_SEEN] = jobs.landed(found)
    active = any(jobs.progress(j).active for j in found)

    @st.fragment(run_every=POLL_S if active else None)
    def _poll():
        now = _read()
        if jobs.landed(now) != st.session_state.get(_SEEN):
            data.clear_results_cache()
            st.rerun()  # the whole page: its listings now include what just finished
        _draw([jobs.progress(j) for j in now], detail)

    _poll()
    return active


def _draw(progress: list[jobs.JobProgress], detail: bool) -> None:
    for p in progress:
        if p.state == "stopped" and detail:
            st.warning(f"the main job in `{p.run}` ended before it finished ({p.stopped}); "
                       f"{len(p.done)} of {p.total} studies done")
        if not p.active:
            continue
        line = jobs.headline(p, _clock)
        if not detail:
            st.caption(line)
            continue
        st.info(line + ". Each study's result shows here as soon as it finishes.")
        st.progress(len(p.done) / max(1, p.total), text=f"{len(p.done)} / {p.total} studies")
        st.dataframe([{"study": r["study"], "status": r["status"],
                       "seconds": r["seconds"], "estimate (s)": r["estimate (s)"], "summary": r["summary"]}
                      for r in p.rows], hide_index=True)
