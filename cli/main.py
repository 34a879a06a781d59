"""The `model-placement` command: render, report, serve | webhook | extender, certs, balloons-policy.

Exit codes: 0 done (or admitted), 3 refused (`render`), 2 bad input or configuration. Bad input is one
sentence naming the file, flag or field, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from placement.config import ConfigError, Settings
from server import logs
from server.inputs import InputError, load_settings
from server.sources import load_cluster

PROG = "model-placement"
DEFAULT_PORTS = {"webhook": 8443, "extender": 8444, "serve": 8443}
SERVERS = ("serve", "webhook", "extender")
LOG_LEVELS = ("debug", "info", "warning", "error")


# -- commands ----------------------------------------------------------------------------------------

def run_render(args: argparse.Namespace, settings: Settings, say: Callable[[str], None]) -> int:
    from cli.render import dump_yaml, exit_code, print_text, render
    from server.inputs import load_manifests

    objects = load_manifests(args.file)  # before the cluster: a typo in FILE should not wait for a list
    results = render(objects, load_cluster(args, settings, say))
    if args.output == "json":
        write = lambda: print(json.dumps(results, indent=2, ensure_ascii=False))  # noqa: E731
    elif args.output == "yaml":
        write = lambda: print(dump_yaml(results, many=True), end="")  # noqa: E731
    else:
        write = lambda: print_text(results)  # noqa: E731
    return emit(write, exit_code(results))


def run_report(args: argparse.Namespace, settings: Settings, say: Callable[[str], None]) -> int:
    from cli.report import print_table, report

    state = load_cluster(args, settings, say)
    if args.output == "json":
        print(json.dumps(report(state), indent=2, ensure_ascii=False))
    else:
        print_table(state)
    return 0


def run_balloons_policy(args: argparse.Namespace, settings: Settings, say: Callable[[str], None]) -> int:
    from cli.policies import UnknownNode, balloons_policies
    from cli.render import dump_yaml

    state = load_cluster(args, settings, say)
    try:
        policies = balloons_policies(state, args.nodes, args.namespace)
    except UnknownNode as exc:
        raise InputError(str(exc)) from None
    print(dump_yaml(policies, many=True), end="")
    return 0


def run_certs(args: argparse.Namespace) -> int:
    from certs import run_certs_command

    return run_certs_command(args.service, args.namespace, args.out, args.days, ca_cert=args.ca_cert,
                             ca_key=args.ca_key, write_ca_key=args.write_ca_key, ca_days=args.ca_days,
                             extra_sans=args.ip)


def run_server(args: argparse.Namespace, settings: Settings) -> int:
    from cli.runner import run

    try:
        return asyncio.run(run(args, settings))
    except OSError as exc:
        # gaierror: --host names no address this machine can resolve (its errno is an EAI_* code).
        if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise InputError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
        raise


# -- the parser --------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see `{self.prog} --help`)")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0-65535; 0 picks a free one)")
    return port


def _ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 or IPv6 address") from None


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return value
    parse.__name__ = kind.__name__
    return parse


def _flag(p: argparse.ArgumentParser, *names: str, default: Any, help: str, suppress: bool = False,
          shown: str | None = None, **kw: Any) -> None:
    """Every flag says its default; `suppress` (on a subcommand) keeps a global flag given before the
    subcommand from being reset by the subcommand's default."""
    if shown is None:
        shown = "off" if kw.get("action") == "store_true" else str(default)
    text = f"{help} (default: {shown})"
    p.add_argument(*names, default=argparse.SUPPRESS if suppress else default, help=text, **kw)


GLOBALS = {"log_level": "info", "config": None, "cluster": None, "kubeconfig": None, "strict": False}


def _global_flags(p: argparse.ArgumentParser, suppress: bool, cluster: bool = True) -> None:
    _flag(p, "--log-level", default="info", choices=LOG_LEVELS, suppress=suppress,
          help="log level of the JSON log lines on stderr")
    if not cluster:
        return
    _flag(p, "--config", metavar="FILE", default=None, suppress=suppress, shown="built-in defaults",
          help="settings YAML; MM_* environment variables override it")
    _flag(p, "--cluster", metavar="FILE", default=None, suppress=suppress, shown="the bundled demo fleet",
          help="what `kubectl get nodes,pods,balloonspolicies,noderesourcetopologies -A -o yaml|json` prints")
    _flag(p, "--kubeconfig", metavar="FILE", default=None, suppress=suppress, shown="none",
          help="read the live cluster through this kubeconfig")
    _flag(p, "--strict", action="store_true", default=False, suppress=suppress,
          help="a malformed object in --cluster is an error instead of being skipped")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_flags(p, suppress=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    r = sub.add_parser("render", help="dry run: the server's verdict, patch and node ranking with reasons")
    r.add_argument("file", metavar="FILE", help="a Pod, Deployment or StatefulSet manifest (several documents "
                   "are fine); - reads standard input")
    _global_flags(r, suppress=True)
    _flag(r, "-o", "--output", choices=["text", "yaml", "json"], default="text", help="output format")

    rep = sub.add_parser("report", help="per node and NUMA node: model pods, balloons, CPUs, free cores")
    _global_flags(rep, suppress=True)
    _flag(rep, "-o", "--output", choices=["table", "json"], default="table", help="output format")

    for name, what in (("serve", "webhook and extender in one process"),
                       ("webhook", "the admission webhook (/mutate, /validate)"),
                       ("extender", "the scheduler extender (/filter, /prioritize, /bind)")):
        s = sub.add_parser(name, help=what)
        _global_flags(s, suppress=True)
        _flag(s, "--in-cluster", action="store_true", default=False, help="read the cluster through the pod's "
              "service account")
        _flag(s, "--host", default="0.0.0.0", metavar="ADDRESS", help="address to listen on")
        _flag(s, "--port", type=_port, default=DEFAULT_PORTS[name], help="TCP port to listen on (0: any free one)")
        _flag(s, "--tls-cert", metavar="FILE", default=None, shown="none", help="serving certificate (PEM); "
              "reloaded when the file changes")
        _flag(s, "--tls-key", metavar="FILE", default=None, shown="none", help="its private key (PEM)")
        _flag(s, "--client-ca", metavar="FILE", default=None, shown="none: no client certificate asked",
              help="require client certificates signed by this CA")
        _flag(s, "--insecure-http", action="store_true", default=False,
              help="plain HTTP (tests, or an http:// extender URL)")
        _flag(s, "--cert-check-seconds", type=_positive(float), default=10.0, metavar="SECONDS",
              help="how often the certificate files are checked for rotation")
        _flag(s, "--shutdown-grace-seconds", type=_positive(float), default=20.0, metavar="SECONDS",
              help="on SIGTERM, how long in-flight requests may take")
        _flag(s, "--drain-seconds", type=float, default=2.0, metavar="SECONDS",
              help="on SIGTERM, how long readiness is false before the listener closes")
        _flag(s, "--extender-body-limit", type=_positive(int), default=None, metavar="BYTES", shown="256 MiB",
              help="largest /filter or /prioritize request body")
        _flag(s, "--scheduler-config", metavar="FILE", default=None, shown="kube-scheduler's 5 s",
              help="the KubeSchedulerConfiguration that calls this extender: /bind and /preempt answer within "
              "its httpTimeout")

    c = sub.add_parser("certs", help="a CA (or an existing one) + serving certificate + caBundle")
    _global_flags(c, suppress=True, cluster=False)
    c.add_argument("--service", required=True, help="the Service the certificate is for (required)")
    c.add_argument("--namespace", required=True, help="its namespace (required)")
    _flag(c, "--out", default=".", metavar="DIR", help="where tls.crt, tls.key and ca.crt are written")
    _flag(c, "--days", type=_positive(int), default=365, help="validity of the serving certificate")
    _flag(c, "--ca-cert", metavar="FILE", default=None, shown="a new CA",
          help="issue from this existing CA certificate (renewal: the caBundle stays the same); needs --ca-key")
    _flag(c, "--ca-key", metavar="FILE", default=None, shown="none", help="the existing CA's private key")
    _flag(c, "--write-ca-key", action="store_true", default=False,
          help="with a new CA, also write its key to DIR/ca.key (0600), to renew from it later")
    _flag(c, "--ca-days", type=_positive(int), default=3650, help="validity of a new CA")
    _flag(c, "--ip", type=_ip, action="append", default=[], metavar="ADDRESS", shown="none",
          help="also valid for this IP address (an extender or webhook reached by IP); repeatable")

    e = sub.add_parser("explain", help="one pending model pod: every node's numbers and the change that would fit it")
    e.add_argument("pod", metavar="POD", help="NAMESPACE/NAME, or NAME with -n")
    _global_flags(e, suppress=True)
    _flag(e, "-n", "--namespace", default="default", help="the pod's namespace when POD has none")
    _flag(e, "-o", "--output", choices=["text", "json"], default="text", help="output format")

    b = sub.add_parser("balloons-policy", help="the per-node BalloonsPolicy the topology model implies")
    b.add_argument("nodes", nargs="*", metavar="NODE", help="node names (default: every node)")
    _global_flags(b, suppress=True)
    _flag(b, "--namespace", default="kube-system", help="namespace of the BalloonsPolicy objects")
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    for key, value in GLOBALS.items():
        if not hasattr(args, key):
            setattr(args, key, value)
    if args.command == "certs":
        given = [f"--{k.replace('_', '-')}" for k in ("config", "cluster", "kubeconfig") if getattr(args, k)]
        if given:
            raise InputError(f"{', '.join(given)} does not apply to certs (see `{PROG} certs --help`)")
        if bool(args.ca_cert) != bool(args.ca_key):
            raise InputError("--ca-cert and --ca-key go together: give both to issue from an existing CA")
        if args.ca_cert and args.write_ca_key:
            raise InputError("--write-ca-key is for a new CA: the existing CA's key is already in --ca-key")
    args.in_cluster = getattr(args, "in_cluster", False)
    sources = [f for f, on in (("--cluster", args.cluster), ("--kubeconfig", args.kubeconfig),
                               ("--in-cluster", args.in_cluster)) if on]
    if len(sources) > 1:
        raise InputError(f"give one of --cluster, --kubeconfig, --in-cluster, not {' and '.join(sources)}")
    return args


# -- main --------------------------------------------------------------------------------------------

def emit(write: Callable[[], None], code: int) -> int:
    """Print the answer; `code` stands when `| head` closes the pipe early (the verdict was reached before
    a line was printed, so `render … | head -3` of a refused pod still exits 3)."""
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    return code


def _quiet_stdout() -> None:
    # What was wanted has been read. Point stdout at /dev/null so that the interpreter's final flush does
    # not complain.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except KeyboardInterrupt:
        return 130


def _main(argv: Sequence[str] | None) -> int:
    from certs import ReloadError

    try:
        args = parse(argv)
    except InputError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    logs.configure(args.log_level)

    def say(text: str) -> None:
        print(f"{PROG}: {text}", file=sys.stderr)

    try:
        if args.command == "certs":
            return run_certs(args)
        settings = load_settings(args.config)
        if args.command in SERVERS:
            return run_server(args, settings)
        from cli.explain import run_explain

        commands = {"render": run_render, "report": run_report, "balloons-policy": run_balloons_policy,
                    "explain": run_explain}
        return commands[args.command](args, settings, say)
    except (InputError, ConfigError, ReloadError) as exc:
        # A server that cannot start says so like every other command: `kubectl logs` of a crash-looping
        # pod shows the one sentence, not a JSON record to unpick.
        say(str(exc))
        return 2
