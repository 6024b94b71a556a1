"""The remote CLI: ``submit``, ``status`` and ``report`` against a running service.

`add_commands(subparsers)` registers the three commands on any argparse sub-parser set, which is
how the engine's ``autofusion`` command offers them next to its local ones; `main()` is the
standalone ``autofusion-client`` script. Each registered parser sets ``func``, a callable taking
the parsed arguments and returning the process exit code (see `EXIT_CODES_HELP`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._client import ENV_API_KEY, ENV_URL, Client
from ._console import ProgressPrinter, render_table, statistics_rows
from ._exceptions import (
    AuthenticationError,
    AutofusionError,
    InvalidRequestError,
    JobFailedError,
    JobNotReadyError,
    NotFoundError,
    ServiceUnavailableError,
)
from ._job import Job
from ._models import JobStatus, Report
from ._retry import RetryPolicy
from ._version import __version__

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INVALID_INPUT = 2
EXIT_JOB_FAILED = 3
EXIT_UNREACHABLE = 4
EXIT_AUTH = 5
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away

EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  other error (wait timed out, corrupted download, unexpected answer)
  2  invalid input: usage, unreadable model or config, model/config rejected, unknown job
  3  the job failed or was cancelled
  4  the service is unreachable (after retries)
  5  authentication failed (missing or wrong API key)
  141  stdout was closed by its reader (e.g. `| head`)
"""

Handler = Callable[[argparse.Namespace], int]


def _connection_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("service")
    group.add_argument(
        "--server",
        metavar="URL",
        default=os.environ.get(ENV_URL),
        help=f"service base URL (default: ${ENV_URL})",
    )
    group.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help=f"API key (default: ${ENV_API_KEY}; prefer the variable, a flag shows up in `ps`)",
    )
    group.add_argument(
        "--http-timeout", type=float, default=30.0, metavar="S", help="per-request timeout (default 30s)"
    )
    group.add_argument(
        "--retries",
        type=int,
        default=RetryPolicy().max_retries,
        metavar="N",
        help="retries on connection errors and 502/503/504, with backoff (default %(default)s)",
    )
    group.add_argument("--json", action="store_true", help="print the job (or report) as JSON on stdout")
    return parent


def _wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="wait until the job finishes")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="give up waiting after S s")
    parser.add_argument(
        "--out", type=Path, metavar="FUSED.onnx", help="download the fused model (implies --wait)"
    )
    parser.add_argument("--bundle", type=Path, metavar="B.tgz", help="download the bundle (implies --wait)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def add_commands(subparsers: Any) -> None:
    """Register ``submit``, ``status`` and ``report`` on an argparse ``add_subparsers()`` object."""
    parent = _connection_options()
    common = {
        "parents": [parent],
        "epilog": EXIT_CODES_HELP,
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }

    submit = subparsers.add_parser(
        "submit",
        help="submit a model to the fusion service",
        description="Upload an ONNX model to the service; with --wait, follow it and fetch the results.",
        **common,
    )
    submit.add_argument("model", type=Path, metavar="MODEL", help="ONNX model file")
    submit.add_argument("--config", type=Path, metavar="CFG.json", help="FusionConfig as a JSON file")
    submit.add_argument("--target", default="cpu", help="compilation target (default: cpu)")
    _wait_options(submit)
    submit.set_defaults(func=_guarded(_cmd_submit))

    status = subparsers.add_parser(
        "status",
        help="show (or wait for) a submitted job",
        description="Show a job by id; with --wait/--out/--bundle, reattach, follow it and fetch results.",
        **common,
    )
    status.add_argument("job_id", metavar="JOB_ID")
    _wait_options(status)
    status.set_defaults(func=_guarded(_cmd_status))

    report = subparsers.add_parser(
        "report",
        help="show the fusion statistics of a finished job",
        description="Print the statistics and decisions of a succeeded job.",
        **common,
    )
    report.add_argument("job_id", metavar="JOB_ID")
    report.set_defaults(func=_guarded(_cmd_report))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autofusion-client",
        description="Talk to a graph-autofusion service: submit models, follow jobs, read reports.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


# -- commands ----------------------------------------------------------------------------------------


class _UsageError(Exception):
    """Bad local input (missing file, unreadable config): exit 2 before any request is made."""


def _guarded(handler: Handler) -> Handler:
    """Map every failure to its documented exit code with a one-line message on stderr."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except _UsageError as exc:
            return _fail(EXIT_INVALID_INPUT, f"error: {exc}")
        except AuthenticationError as exc:
            return _fail(EXIT_AUTH, f"authentication failed: {exc}")
        except ServiceUnavailableError as exc:
            return _fail(EXIT_UNREACHABLE, f"service unreachable: {exc}")
        except JobFailedError as exc:
            return _fail(EXIT_JOB_FAILED, f"job {exc.job.id} {exc.job.status.value}: {exc}")
        except (InvalidRequestError, NotFoundError) as exc:
            return _fail(EXIT_INVALID_INPUT, f"rejected: {exc}")
        except AutofusionError as exc:
            return _fail(EXIT_ERROR, f"error: {exc}")
        except KeyboardInterrupt:
            return _fail(130, "interrupted (the job keeps running on the service)")
        except BrokenPipeError:
            return _closed_stdout()

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


def _closed_stdout() -> int:
    """The reader of stdout went away (`autofusion report --json | head`): stop quietly, as Unix
    tools do, with 128 + SIGPIPE. Python's final flush would fail on the closed pipe once more and
    print a traceback, so stdout is pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _fail(code: int, message: str) -> int:
    print(message, file=sys.stderr)
    return code


def _client(args: argparse.Namespace) -> Client:
    if not args.server:
        raise _UsageError(f"no service URL: pass --server or set {ENV_URL}")
    try:
        retry = RetryPolicy(max_retries=max(0, args.retries))
        return Client(args.server, api_key=args.api_key, timeout=args.http_timeout, retry=retry)
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc


def _load_config(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise _UsageError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise _UsageError(f"config {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _UsageError(f"config {path} must hold a JSON object, not {type(data).__name__}")
    return data


def _cmd_submit(args: argparse.Namespace) -> int:
    if not args.model.is_file():
        raise _UsageError(f"model file not found: {args.model}")
    config = _load_config(args.config)
    with _client(args) as client:
        job = client.submit(args.model, config=config, target=args.target)
        if not args.json and not args.quiet:
            print(f"submitted job {job.id} ({job.status.value})", file=sys.stderr)
        return _follow(client, job, args)


def _cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return _follow(client, client.get_job(args.job_id), args)


def _cmd_report(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.get_job(args.job_id)
        job.raise_for_status()
        try:
            report = job.report()
        except JobNotReadyError:
            return _fail(EXIT_ERROR, f"job {job.id} is still {job.refresh().status.value}; no report yet")
        if args.json:
            print(json.dumps(report.model_dump(mode="json"), indent=2))
        else:
            print(render_table(statistics_rows(job, report)))
        return EXIT_OK


def _follow(client: Client, job: Job, args: argparse.Namespace) -> int:
    """Optionally wait and download, then print the job (and, once it succeeded, the statistics)."""
    if args.wait or args.out or args.bundle:
        printer = None if args.quiet else ProgressPrinter(sys.stderr)
        try:
            job.wait(timeout=args.timeout, on_progress=printer)
        finally:
            if printer is not None:
                printer.close()
        if job.status is JobStatus.SUCCEEDED:
            if args.out:
                client.download_model(job, args.out)
            if args.bundle:
                client.download_bundle(job, args.bundle)
    report: Report | None = job.report() if job.status is JobStatus.SUCCEEDED else None
    if args.json:
        payload = job.to_dict()
        if report is not None:
            payload["report"] = report.model_dump(mode="json")
        print(json.dumps(payload, indent=2))
    else:
        print(render_table(statistics_rows(job, report)))
        if job.status is JobStatus.SUCCEEDED:
            for label, path in (("fused model", args.out), ("bundle", args.bundle)):
                if path:
                    print(f"{label} written to {path}")
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        problem = f": [{job.error.code}] {job.error.detail}" if job.error is not None else ""
        return _fail(EXIT_JOB_FAILED, f"job {job.id} {job.status.value}{problem}")
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
