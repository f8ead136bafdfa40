"""What a run's background failures print: one warning line each, the details in the log file.

Each case runs in a fresh interpreter, because the hooks are process-wide and some failures
are only noticed as the process ends."""

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(tmp_path: Path, body: str) -> tuple[str, str]:
    script = textwrap.dedent("""\
        import sys, threading, warnings
        from pathlib import Path
        from pax_core.run.logfile import library_logs, report_background_failures
        report_background_failures()
        with library_logs(Path(sys.argv[1]), 0):
        """) + textwrap.indent(textwrap.dedent(body), "    ")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = tmp_path / "logs" / "process_0.log"
    return done.stderr, log.read_text() if log.exists() else ""


def test_a_coroutine_a_failed_save_left_unawaited_goes_to_the_log_only(tmp_path):
    err, log = _run(tmp_path, """\
        async def write_fragment():
            pass
        dropped = write_fragment()
        del dropped
        """)
    assert err == "", err
    assert "coroutine 'write_fragment' was never awaited" in log


def test_other_warnings_still_reach_the_console(tmp_path):
    err, _ = _run(tmp_path, """\
        warnings.warn("not awaited, but about something else", RuntimeWarning, stacklevel=1)
        """)
    assert "RuntimeWarning: not awaited, but about something else" in err


def test_a_dying_thread_is_one_warning_line_with_the_traceback_in_the_log(tmp_path):
    err, log = _run(tmp_path, """\
        def save():
            raise OSError(28, "No space left on device")
        for _ in range(2):
            thread = threading.Thread(target=save, name="save")
            thread.start()
            thread.join()
        """)
    assert err.splitlines() == [
        "pax: warning: a background thread (save) failed: OSError: [Errno 28] No space left on "
        f"device (details in {tmp_path}/logs/process_0.log)"], err
    assert log.count("Traceback") == 2 and ", in save" in log


def test_after_a_run_failed_its_libraries_unfinished_writes_go_to_the_log_only(tmp_path):
    """A save that fails on a full disk stops the run with one line; the save's other writes
    fail too, and asyncio reports them as the process ends."""
    script = textwrap.dedent("""\
        import asyncio, gc, sys
        from pathlib import Path
        from pax_core.run.logfile import library_logs, report_background_failures
        report_background_failures()

        async def write_shard():
            raise ValueError("RESOURCE_EXHAUSTED: error writing file: No space left on device")

        loop = asyncio.new_event_loop()
        try:
            with library_logs(Path(sys.argv[1]), 0):
                pending = loop.create_task(write_shard())
                loop.run_until_complete(asyncio.sleep(0))
                raise OSError(28, "No space left on device")
        except OSError:
            pass
        del pending
        gc.collect()
        """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    log = (tmp_path / "logs" / "process_0.log").read_text()
    assert "RESOURCE_EXHAUSTED: error writing file" in log and "in write_shard" in log
