"""``mineru-health``: patch MinerU, classify failures, list rules, probe workers, run the demo.

Exit codes: 0 success (``classify``: task-local), 1 ``classify``: fatal /
``patch check``: not every file patched, 2 usage or runtime error, 3 MinerU
version not supported (4.x, or no patch set for it), 4 a target file was
modified by someone else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from .errors import ConfigError, MineruHealthError, PatchError

if TYPE_CHECKING:
    from .runtime.settings import HealthSettings

__all__ = ["main", "probe_urls"]

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_ERROR = 2


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


# --- patch -----------------------------------------------------------------------------------


def _cmd_patch(args: argparse.Namespace) -> int:
    from . import patching

    if args.action == "make-entry":
        if not args.target or not args.patch_file:
            raise PatchError("make-entry needs --target and --patch-file", exit_code=EXIT_ERROR)
        if args.mineru_path is None:
            raise PatchError(
                "make-entry needs --mineru-path (a pristine tree)", exit_code=EXIT_ERROR
            )
        try:
            entry = patching.make_variant(args.mineru_path, args.target, args.patch_file)
        except OSError as error:
            raise PatchError(str(error), exit_code=EXIT_ERROR) from error
        _print_json(entry)
        return EXIT_OK

    action = {"apply": patching.apply, "check": patching.check, "revert": patching.revert}
    try:
        report = action[args.action](args.mineru_path)
    except OSError as error:
        # An I/O error is an error like any other: exit 2, JSON under --json.
        where = f" ({error.filename})" if error.filename else ""
        raise PatchError(f"{error.strerror or error}{where}", exit_code=EXIT_ERROR) from error
    if args.json:
        _print_json(report.to_json())
    else:
        print(f"MinerU {report.mineru_version} at {report.mineru_dir} (line {report.line})")
        for status in report.files:
            extra = f" ({status.action})" if status.action else ""
            print(f"  {status.target}: {status.state.value}{extra}")
        for leftover in report.cleaned:
            print(f"  removed {leftover}, left by an interrupted run")
    if args.action == "check" and not report.all_patched:
        return EXIT_FATAL
    return EXIT_OK


# --- classify --------------------------------------------------------------------------------


def _read_input(source: str | None) -> str:
    """The text to classify, any bytes accepted: invalid UTF-8 becomes U+FFFD."""
    if source in (None, "-"):
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "replace")
    else:
        data = Path(source).read_bytes()
    return data.decode("utf-8", "replace")


def _verdict_json(verdict: Any, frame: Any) -> dict[str, Any]:
    return {
        "fatal": verdict.fatal,
        "kind": verdict.kind,
        "ambiguous": verdict.ambiguous,
        "remote_engine": verdict.remote_engine,
        "matched": verdict.matched,
        "rule": verdict.rule,
        "category": verdict.category,
        "strength": verdict.strength,
        "frame_index": verdict.frame_index,
        "frame": None
        if frame is None
        else {
            "module": frame.module,
            "type_name": frame.type_name,
            "bases": list(frame.bases),
            "raised_in": frame.raised_in,
            "via": frame.via.name.lower(),
            "depth": frame.depth,
        },
        "excerpt": verdict.excerpt,
        "exit_code": EXIT_FATAL if verdict.fatal else EXIT_OK,
    }


def _cmd_classify(args: argparse.Namespace) -> int:
    from .classifier import classify_frames, load_rules
    from .tracebacks import frames_from_text

    text = _read_input(args.file)
    rules = load_rules(args.rules) if args.rules else None
    frames = frames_from_text(text)
    verdict = classify_frames(
        frames,
        rules=rules,
        remote_engine=args.remote_engine,
        trust_unknown_origin=not args.untrusted,
    )
    frame = frames[verdict.frame_index] if 0 <= verdict.frame_index < len(frames) else None
    if args.json:
        _print_json(_verdict_json(verdict, frame))
    else:
        print(verdict.kind)
        if verdict.matched:
            where = frame.qualified_name if frame is not None else ""
            print(f"  rule:     {verdict.rule} ({verdict.category}, {verdict.strength})")
            print(f"  frame:    #{verdict.frame_index} {where}".rstrip())
            print(f"  excerpt:  {verdict.excerpt}")
            if verdict.remote_engine:
                print("  remote:   the engine is remote; this worker stays healthy")
        else:
            print("  no rule matched: the failure stays local to its task")
    return EXIT_FATAL if verdict.fatal else EXIT_OK


# --- rules -----------------------------------------------------------------------------------


def _rule_json(rule: Any) -> dict[str, Any]:
    return {
        "id": rule.id,
        "kind": rule.kind_name,
        "strength": rule.strength,
        "category": rule.category,
        "target": rule.target_name,
        "origin": rule.scope_name,
        "operator": rule.from_operator,
        "pattern": rule.pattern,
    }


def _cmd_rules(args: argparse.Namespace) -> int:
    from .classifier import load_rules, parse_rules_file

    if args.check:
        parsed = parse_rules_file(args.check)
        merged = load_rules(args.check)  # also compiles the merged set
        warnings = parsed.warnings()
        if args.json:
            _print_json(
                {
                    "file": args.check,
                    "ok": True,
                    "rules": len(parsed.rules),
                    "disabled": list(parsed.disabled),
                    "warnings": warnings,
                    "total_after_merge": len(merged),
                    "exit_code": EXIT_OK,
                }
            )
        else:
            off = f", {len(parsed.disabled)} built-in(s) off" if parsed.disabled else ""
            print(
                f"{args.check}: OK, {len(parsed.rules)} rule(s){off}; {len(merged)} after "
                "merging with the built-in rules"
            )
            for warning in warnings:
                print(f"{args.check}: warning: {warning}", file=sys.stderr)
        return EXIT_OK

    rules = load_rules(args.rules)
    if args.json:
        _print_json({"sources": list(rules.sources), "rules": [_rule_json(r) for r in rules.rules]})
    else:
        print(f"# {len(rules)} rules from {', '.join(rules.sources)}")
        print("# <id> <kind> <category> target=<type|message|frame> origin=<engine|any> <pattern>")
        for r in rules.rules:
            print(r.to_line())
    return EXIT_OK


# --- probe ------------------------------------------------------------------------------------


def probe_urls(
    urls: Iterable[str],
    *,
    timeout_s: float | None = None,
    expected_status: str | None = None,
    as_json: bool = False,
    settings: HealthSettings | None = None,
    out: TextIO | None = None,
) -> int:
    """Probes every URL once, all concurrently; prints a table (or JSON).

    Text from workers (a probe's ``detail`` can quote a worker's ``/health``
    error) is escaped for the terminal: control characters and ANSI escapes
    are shown, never interpreted. JSON carries it as it is.

    Returns 0 when every URL answered healthy, 1 otherwise. Settings come from
    ``MINERU_ROUTER_HEALTH_*`` unless given; ``timeout_s`` and
    ``expected_status`` override them. Load fields are required only when the
    expected status is MinerU's ``"healthy"``.
    """
    from . import _native
    from ._names import enum_name
    from .runtime.router.fleet import base_url_of, expectations
    from .runtime.settings import HealthSettings

    out = out or sys.stdout
    base = settings or HealthSettings.from_env()
    changes: dict[str, Any] = {}
    if timeout_s is not None:
        if timeout_s <= 0:
            raise ConfigError("timeout must be positive", variable="--timeout")
        changes["probe_timeout_s"] = timeout_s
        changes["connect_timeout_s"] = min(base.connect_timeout_s, timeout_s)
        changes["interval_s"] = max(base.interval_s, timeout_s * 2)
    if expected_status is not None:
        changes["expected_status"] = expected_status
    current = base.replace(**changes) if changes else base
    url_list = list(urls)
    # Ids are positions, so a URL given twice is probed twice and reported in order.
    targets = [_native.Target(str(i), base_url_of(url), False) for i, url in enumerate(url_list)]
    expect = expectations(current, require_load_fields=current.expected_status == "healthy")
    results, _stats = _native.Poller.sweep(targets, current.native, expect)
    by_id = {result.worker_id: result for result in results}
    rows = []
    for target, url in zip(targets, url_list):
        result = by_id.get(target.id)
        if result is None:  # the sweep answers every target; stay safe if one is missing
            rows.append(_row(url, False, "transport_error", 0, 0.0, "no result"))
            continue
        rows.append(
            _row(
                url,
                bool(result.healthy),
                enum_name(result.status),
                int(result.http_status),
                result.latency_s,
                result.detail,
            )
        )
    if as_json:
        out.write(json.dumps(rows, ensure_ascii=False, indent=2) + "\n")
    else:
        _print_table(rows, out)
    return 0 if rows and all(row["healthy"] for row in rows) else 1


def _row(
    url: str, healthy: bool, status: str, http_status: int, latency_s: float, detail: str
) -> dict[str, Any]:
    return {
        "url": url,
        "healthy": healthy,
        "status": status,
        "http_status": http_status,
        "latency_ms": round(latency_s * 1000.0, 1),
        "detail": detail,
    }


def _print_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    from .safe_text import printable

    headers = ["URL", "STATUS", "HTTP", "LATENCY_MS", "DETAIL"]
    cells = [
        [
            printable(r["url"]),
            r["status"],
            str(r["http_status"] or "-"),
            f"{r['latency_ms']:.1f}",
            printable(r["detail"]),
        ]
        for r in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers[:-1])]
    for line in [headers, *cells]:
        padded = [cell.ljust(width) for cell, width in zip(line[:-1], widths)]
        out.write("  ".join([*padded, line[-1]]).rstrip() + "\n")


def _cmd_probe(args: argparse.Namespace) -> int:
    kwargs: dict[str, Any] = {"as_json": args.json}
    if args.timeout is not None:
        kwargs["timeout_s"] = args.timeout
    if args.expected_status is not None:
        kwargs["expected_status"] = args.expected_status
    return probe_urls(args.urls, **kwargs)


def _cmd_config(args: argparse.Namespace) -> int:
    from ._names import enum_name
    from .runtime import settings

    if args.check:
        # The start-up checks of the router and of the worker, in that order:
        # each raises ConfigError naming the variable, as the process would.
        from .classifier import default_rules

        checked: dict[str, Any] = {}
        if args.role in ("router", "all"):
            checked["router"] = settings.HealthSettings.from_env().as_dict()
        if args.role in ("worker", "all"):
            checked["worker"] = settings.WorkerSettings.from_env().as_dict()
        checked["rules"] = len(default_rules())  # both read MINERU_HEALTH_RULES at start-up
        if args.json:
            _print_json(checked)
        else:
            for role in ("router", "worker"):
                if role in checked:
                    print(f"{role}: OK")
                    for name, value in checked[role].items():
                        print(f"  {name} = {value!r}")
            print(f"rules: OK, {checked['rules']} rule(s)")
        return EXIT_OK
    if args.json:
        _print_json([settings.variable_json(v) for v in settings.variables()])
    elif args.markdown:
        print(settings.markdown_tables(), end="")
    else:
        for v in settings.variables():
            default = repr(v.default_value) if v.default_value else "unset"
            component = enum_name(v.component)
            print(f"{v.name} ({component}; default {default}; {v.allowed}): {v.meaning}")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(list(args.demo_args))


# --- parser ----------------------------------------------------------------------------------


def _version() -> str:
    """``0.3.0 (patches MinerU 3.3.0-3.4.5, 4.0.12)``: the MinerU releases read from the
    shipped patch manifests, so the answer is what ``patch apply`` accepts."""
    from . import __version__, patching
    from .errors import MineruHealthError

    try:
        return f"{__version__} (patches MinerU {patching.supported_releases()})"
    except MineruHealthError as exc:
        return f"{__version__} ({exc})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mineru-health",
        description="Self-healing health checks for MinerU workers and router (3.3-3.4 and 4.0).",
        epilog="Exit codes: 0 ok, 1 fatal verdict / not patched, 2 error, "
        "3 unsupported MinerU, 4 file modified by someone else.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    patch = sub.add_parser(
        "patch",
        help="apply, check or revert the MinerU patches",
        description="Apply, check or revert the mineru-health patches on a MinerU install "
        "(3.3.0-3.4.5, 4.0.x), recognised by its files' contents, not its version string. "
        "Idempotent and all or nothing (a failure restores every file, exit 2); keeps "
        "<file>.mineru-health.orig backups; never follows symbolic links (a linked target or "
        "backup is refused, exit 2); refuses files modified by someone else (exit 4) and "
        "releases whose files it does not know (exit 3).",
    )
    patch.add_argument(
        "action",
        choices=("apply", "check", "revert", "make-entry"),
        help="what to do (make-entry: print a manifest variant, for maintainers)",
    )
    patch.add_argument(
        "--mineru-path",
        metavar="DIR",
        help="the mineru package directory (default: the importable one)",
    )
    patch.add_argument("--target", help="make-entry: file relative to the mineru package dir")
    patch.add_argument("--patch-file", help="make-entry: the unified diff")
    patch.add_argument("--json", action="store_true", help="machine-readable output")
    patch.set_defaults(func=_cmd_patch)

    classify = sub.add_parser(
        "classify",
        help="classify a traceback or error message (exit 1 if fatal)",
        description="Read a Python traceback or an error message (any bytes) and say whether "
        "it means the inference engine died (fatal, exit 1) or only the task failed (exit 0, "
        "also for an ambiguous device error such as out of memory); exit 2 on any error.",
    )
    classify.add_argument("file", nargs="?", default="-", help="file to read (default: stdin)")
    classify.add_argument(
        "--rules", metavar="FILE", help="rules file to merge (default: $MINERU_HEALTH_RULES)"
    )
    classify.add_argument(
        "--remote-engine",
        action="store_true",
        help="the failing task's engine was remote (an *-http-client backend)",
    )
    classify.add_argument(
        "--untrusted",
        action="store_true",
        help="the text comes from an untrusted source: frames without a "
        "traceback line do not count as an engine's",
    )
    classify.add_argument(
        "--json", action="store_true", help="machine-readable output (always JSON, errors included)"
    )
    classify.set_defaults(func=_cmd_classify)

    rules = sub.add_parser(
        "rules",
        help="list the classification rules or validate a rules file",
        description="List the built-in rules merged with $MINERU_HEALTH_RULES (or --rules), "
        "or validate a rules file with --check FILE.",
    )
    rules.add_argument("--check", metavar="FILE", help="validate FILE and exit")
    rules.add_argument("--rules", metavar="FILE", help="rules file to merge for the listing")
    rules.add_argument("--json", action="store_true", help="machine-readable output")
    rules.set_defaults(func=_cmd_rules)

    probe = sub.add_parser(
        "probe",
        help="probe worker /health URLs once",
        description="Probe each URL once with the native prober and report the result.",
    )
    probe.add_argument("urls", nargs="+", metavar="URL", help="worker health URLs")
    probe.add_argument("--timeout", type=float, metavar="S", help="per-probe timeout in seconds")
    probe.add_argument(
        "--expected-status", metavar="STATUS", help='healthy JSON "status" value (default: healthy)'
    )
    probe.add_argument("--json", action="store_true", help="machine-readable output")
    probe.set_defaults(func=_cmd_probe)

    config = sub.add_parser(
        "config",
        help="list the MINERU_HEALTH_* and MINERU_ROUTER_HEALTH_* variables or check them",
        description="List the worker and router health variables with defaults, bounds and "
        "meaning, or, with --check, validate the current environment exactly as "
        "mineru-api and mineru-router do at start-up.",
    )
    config.add_argument(
        "--check",
        action="store_true",
        help="validate the current environment (exit 2 naming the bad variable)",
    )
    config.add_argument(
        "--role",
        choices=("router", "worker", "all"),
        default="all",
        help="--check: whose start-up checks to apply (default: all)",
    )
    config.add_argument("--markdown", action="store_true", help="print a Markdown table")
    config.add_argument("--json", action="store_true", help="machine-readable output")
    config.set_defaults(func=_cmd_config)

    demo = sub.add_parser(
        "demo",
        help="run the end-to-end self-healing demo",
        description="Run the demo (arguments after 'demo' are passed on; try 'demo --help').",
        add_help=False,
    )
    demo.add_argument("demo_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    demo.set_defaults(func=_cmd_demo)
    return parser


def _report_error(
    args: argparse.Namespace | None, error: BaseException, exit_code: int, as_json: bool
) -> int:
    """Prints ``error`` (JSON with ``--json``) and returns ``exit_code``."""
    details = [str(detail) for detail in getattr(error, "errors", [])]
    if as_json:
        _print_json(
            {
                "error": str(error),
                "type": type(error).__name__,
                "errors": details,
                "exit_code": exit_code,
            }
        )
    else:
        print(f"mineru-health: error: {error}", file=sys.stderr)
        for detail in details[1:]:
            print(f"  {detail}", file=sys.stderr)
    return exit_code


class _UsageError(Exception):
    """A command line argparse refused."""


class _Parser(argparse.ArgumentParser):
    # argparse prints usage and exits with 2 by itself; raising instead lets
    # main() answer in JSON when --json was asked for.
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message}")


def _safe_streams() -> None:
    # Whatever PYTHONIOENCODING says, an unencodable character becomes '?'
    # instead of a traceback halfway through the output.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):
                reconfigure(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    _safe_streams()
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    as_json = "--json" in arguments
    if arguments[:1] == ["demo"]:
        # argparse's REMAINDER drops option-like first arguments ("demo --help"),
        # so the demo gets its arguments untouched.
        args = argparse.Namespace(func=_cmd_demo, demo_args=arguments[1:], json=False)
    else:
        try:
            args = parser.parse_args(arguments)
        except _UsageError as error:
            if not as_json:
                parser.print_usage(sys.stderr)
            return _report_error(None, error, EXIT_ERROR, as_json)
    as_json = bool(getattr(args, "json", False))
    try:
        code: int = args.func(args)
    except MineruHealthError as error:
        return _report_error(args, error, int(getattr(error, "exit_code", EXIT_ERROR)), as_json)
    except Exception as error:  # noqa: BLE001 - exit 1 means "fatal": never end in a traceback
        return _report_error(args, error, EXIT_ERROR, as_json)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
