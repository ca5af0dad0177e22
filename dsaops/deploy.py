"""`dsaops deploy`: run playbooks/cluster.yml through ansible-runner, with progress and a summary.

`--print-commands` runs playbooks/print-commands.yml instead: it renders each node's server
command (the sglang_server role's own template, so there is one source of truth for it) on
this machine and prints it, touching no host.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dsaops.errors import UserError
from dsaops.inventory_checks import SECRET_VARIABLES, UIDS, refusal, refusals
from dsaops.plan_input import JSON_MOST_BYTES, read_text

PLAYBOOKS = Path(__file__).resolve().parent.parent / "playbooks"
INVENTORIES = PLAYBOOKS / "inventories"
LISTING_TIMEOUT_S = 120  # a dynamic inventory may ask a cloud API; one that hangs must not hang the deploy
FAILURE_LINES, FAILURE_LINE_CHARS = 3, 240  # of a failed command's output, on its failure line
PHASES = ("preflight", "host_memory", "network", "image", "weights", "sglang_server", "health", "monitoring")


def add_parser(sub) -> None:
    p = sub.add_parser("deploy", help="deploy SGLang serving with the Ansible playbooks (playbooks/cluster.yml)")
    p.add_argument("-i", "--inventory", required=True,
                   help="an inventory file, or a name in playbooks/inventories (local, dgx-spark-2x, h20-8gpu, mi300x)")
    p.add_argument("--check", action="store_true", help="dry run: report what would change and change nothing")
    p.add_argument("--print-commands", action="store_true",
                   help="print each node's server command and environment without touching any host")
    p.add_argument("--tags", help=f"run only these phases, comma-separated: {', '.join(PHASES)}")
    p.add_argument("--limit", help="run on these hosts only (Ansible pattern)")
    p.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                   help="extra variables as for ansible-playbook (KEY=VALUE, JSON, or @FILE: a YAML or JSON file of at "
                        f"most {JSON_MOST_BYTES >> 20} MiB); repeatable")
    p.add_argument("-v", "--verbose", action="count", default=0, help="show every task result (-vv: Ansible's -v)")
    p.set_defaults(func=run)


def resolve_inventory(name: str) -> Path:
    for candidate in (Path(name), INVENTORIES / name, INVENTORIES / f"{name}.yml"):
        if candidate.is_file():
            return candidate.resolve()
    known = ", ".join(sorted(p.stem for p in INVENTORIES.glob("*.yml")))
    raise UserError(f"inventory {name!r} not found; give a file or one of: {known}")


def _members(listing: dict, group: str) -> set[str]:
    """Hosts of `group` in `ansible-inventory --list` output, through its child groups."""
    entry = listing.get(group, {})
    return set(entry.get("hosts", [])).union(*(_members(listing, child) for child in entry.get("children", [])))


def _listing(inventory: Path, path: str, *options: str) -> tuple[dict, str]:
    """`ansible-inventory --list` of `inventory` (empty when Ansible cannot read it), and its stderr."""
    try:
        listed = subprocess.run([shutil.which("ansible-inventory", path=path) or "ansible-inventory", "-i",
                                 str(inventory), "--list", *options], capture_output=True, text=True, check=False,
                                timeout=LISTING_TIMEOUT_S,
                                env=os.environ | {"ANSIBLE_CONFIG": str(PLAYBOOKS.parent / "ansible.cfg"), "PATH": path})
    except subprocess.TimeoutExpired:
        raise UserError(f"{inventory}: ansible-inventory listed no hosts within {LISTING_TIMEOUT_S} s (an inventory "
                        f"script or plugin that hangs?); check that `ansible-inventory -i {inventory} --list` "
                        "finishes") from None
    try:
        return json.loads(listed.stdout), listed.stderr
    except json.JSONDecodeError:
        return {}, listed.stderr


def _hosts(listing: dict) -> set[str]:
    return set(listing.get("_meta", {}).get("hostvars", {})) | _members(listing, "all")


def _shown(host: str) -> str:
    """A host name fit for a one-line message (as check-inventory.yml shows it)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "?", host)


def _plain(value) -> bool:
    """Whether `value` is what Ansible will use: no template to render, no vault to decrypt."""
    if isinstance(value, str):
        return "{{" not in value and "{%" not in value
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return "__ansible_vault" not in value and all(_plain(v) for v in value.values())
    return not isinstance(value, _Opaque)


def check_inventory(inventory: Path, path: str, limit: str | None = None, overrides: dict | None = None) -> set[str]:
    """The inventory's hosts; stops before Ansible runs when it has no serving hosts (Ansible itself
    skips every play of an empty or unreadable inventory and reports success), when `limit` matches
    none of them, or when a value of the hosts the run checks is refused (as check-inventory.yml
    refuses it, and the extras as the preflight's plan reads them, with the -e `overrides` on top; None: some
    are encrypted, leave the check to the playbook)."""
    listing, stderr = _listing(inventory, path)
    if not _members(listing, "dsaops_cluster"):
        unreadable = "Unable to parse" in stderr
        why = "Ansible cannot read it as an inventory" if unreadable else "it puts no host in group dsaops_cluster"
        raise UserError(f"{inventory}: {why}; give an inventory with the dsaops groups (dsaops_cluster with "
                        f"dsaops_head and dsaops_workers), e.g. {INVENTORIES / 'dgx-spark-2x.yml'}")
    if not _members(listing, "dsaops_head"):
        raise UserError(f"{inventory}: no host in group dsaops_head; put the node of rank 0 there")
    hosts = _hosts(listing)
    checked = _members(listing, "dsaops_cluster") | _members(listing, "dsaops_monitoring")
    if limit:
        limited = _hosts(_listing(inventory, path, "--limit", limit)[0])
        if not limited:
            raise UserError(f"--limit {limit!r} matches no host of {inventory}; give a pattern that matches "
                            f"one of its hosts: {', '.join(sorted(map(_shown, hosts)))}")
        checked &= limited
    if overrides is not None:
        hostvars = listing.get("_meta", {}).get("hostvars", {})
        defaults = _uid_defaults()
        refused: dict[str, list[str]] = {}
        for host in sorted(checked):
            values = {"inventory_hostname": host, **defaults, **hostvars.get(host, {}), **overrides}
            plain = {name: value for name, value in values.items() if _plain(value)}
            for line in refusals(plain) or _extras_refused(plain):
                refused.setdefault(line, []).append(_shown(host))
        if refused:
            raise UserError(" ".join(f"{', '.join(on)}: {line}" for line, on in refused.items()))
    return hosts


def _extras_refused(values: dict) -> list[str]:
    """The line the preflight's plan stops on for sglang_server_extra_args and _env (dsaops.plan_extras: what
    SGLang's parser or the planner refuses), once the table has taken every value."""
    args, env = values.get("sglang_server_extra_args"), values.get("sglang_server_extra_env")
    if args is None and env is None:
        return []
    from dsaops import plan_extras  # for a host with extras alone: every dsaops command imports this module
    try:
        plan_extras.read(args or [], env or {})
    except UserError as e:
        return [str(e)]
    return []


def _uid_defaults() -> dict:
    """The monitoring role's default uids: a uid the inventory sets to another container's default is refused too."""
    import yaml  # beside Ansible; the CLI's other commands stay stdlib-only

    defaults = yaml.safe_load((PLAYBOOKS / "roles/monitoring/defaults/main.yml").read_text())
    return {name: defaults[name] for name in UIDS if name in defaults}


class _Opaque:
    """A value Ansible alone can read (a !vault or !unsafe tag): not checked before it runs."""


def _load_yaml(text: str):
    """`text` as Ansible loads extra variables: JSON, else YAML (its tags read as _Opaque)."""
    import yaml  # beside Ansible; the CLI's other commands stay stdlib-only

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: _Opaque())
    try:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return yaml.load(text, Loader=Loader)  # a SafeLoader that also reads Ansible's tags
    except RecursionError:  # both parsers recurse once a level: [[[[... past the interpreter's limit
        raise ValueError("nests deeper than the parser follows") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"is not valid JSON or YAML{where} ({why})") from None


def read_extra_vars(extra: str) -> tuple[str, dict | None]:
    """An -e argument checked as Ansible will read it: the argument to pass on (@FILE made absolute, as
    Ansible reads a relative one from the playbooks' folder) and the variables it sets (None: encrypted)."""
    argument = extra
    if extra.startswith("@"):
        file = Path(extra[1:]).expanduser().absolute()
        argument, what = f"@{file}", f"-e {extra}"
        if not file.exists():
            raise UserError(f"{what}: no such file ({file}); give the path of a YAML or JSON file of variables")
        if file.is_dir():
            raise UserError(f"{what}: {file} is a folder; give a YAML or JSON file of variables")
        if not file.is_file():  # opening a pipe waits for a writer; Ansible reads the file again after this
            raise UserError(f"{what}: {file} is not a regular file (a pipe or device); give a YAML or JSON file "
                            "of variables")
        text = read_text(file, f"{what}:", fix="give a readable YAML or JSON file of variables")
        if text.startswith("$ANSIBLE_VAULT;"):
            return argument, None
        fix = "give NAME: VALUE lines or a JSON object"
    elif extra[:1] in ("/", "."):
        raise UserError(f"-e {extra}: give a file of variables with @, as -e @{extra}")
    elif extra[:1] in ("{", "["):
        what, text, fix = "an -e argument starting with " + extra[0], extra, 'give an object such as \'{"name": 1}\''
    else:
        try:
            words = shlex.split(extra, posix=True)
        except ValueError:  # not shown: the argument may hold a secret
            raise UserError("an -e argument has an unclosed quote; close it, or give the variables in a file "
                            "with -e @FILE") from None
        return extra, dict(word.split("=", 1) for word in words if "=" in word)
    try:
        variables = _load_yaml(text)
    except ValueError as e:
        raise UserError(f"{what} {e}; {fix}") from None
    if not isinstance(variables, dict):
        raise UserError(f"{what} holds no mapping of variables; {fix}")
    return argument, variables


def inline_secret(extra: str, variables: dict | None) -> str | None:
    """The secret variable an -e argument sets on the command line, if any, of `variables` (what
    read_extra_vars found in it): `-e @FILE` sets none there."""
    if extra.startswith("@"):
        return None
    return next((name for name in SECRET_VARIABLES if name in variables), None)


def run(args) -> int:
    return deploy(args.inventory, check=args.check, print_commands=args.print_commands, tags=args.tags,
                  limit=args.limit, extra_vars=args.extra_vars, verbose=args.verbose)


def deploy(inventory: str, *, check: bool = False, print_commands: bool = False, tags: str | None = None,
           limit: str | None = None, extra_vars: Sequence[str] = (), verbose: int = 0) -> int:
    """Run cluster.yml (or, with print_commands, print-commands.yml) on `inventory` (a file or a
    name in playbooks/inventories): 0 when it succeeded, 1 when a task failed (named on stderr)."""
    if not (PLAYBOOKS / "cluster.yml").is_file():
        raise UserError(f"the playbooks are not here ({PLAYBOOKS}); run dsaops deploy from a dsaops source checkout")
    if print_commands and (check or tags):
        raise UserError("--print-commands renders commands only; drop --check/--tags")
    # the weights and sglang_server roles check it only when they start, after other roles changed the nodes
    if refusal("weights_hf_token", os.environ.get("HF_TOKEN", "")):
        raise UserError("HF_TOKEN in the environment holds a newline, space or a character other than printable "
                        "ASCII; give the Hugging Face token alone")
    passed: list[str] = []
    overrides: dict | None = {}
    for extra in extra_vars:
        argument, variables = read_extra_vars(extra)
        if secret := inline_secret(extra, variables):
            raise UserError(f"-e {secret}=...: a secret on the command line is shown by ps to every user; give it "
                            "from an Ansible vault in the inventory, from a file (-e @FILE, mode 0600), or, for the "
                            "Hugging Face token, as HF_TOKEN in dsaops deploy's environment")
        passed.append(argument)
        overrides = None if overrides is None or variables is None else overrides | variables
    if tags is not None:  # "" would run every phase
        unknown = set(tags.split(",")) - set(PHASES)
        if unknown:
            raise UserError(f"unknown phase(s) {', '.join(sorted(unknown)) or repr(tags)}; phases: {', '.join(PHASES)}")
    inventory_path = resolve_inventory(inventory)
    try:
        import ansible_runner
    except ImportError:
        raise UserError("ansible-runner is not installed: run `make setup` in the dsaops checkout "
                        "(or `pip install -e '.[deploy]'` there)") from None
    # Prefer the ansible-playbook installed beside this Python (a virtual environment need not be active).
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    if not shutil.which("ansible-playbook", path=path):
        raise UserError("ansible-playbook is not installed: run `make setup` in the dsaops checkout "
                        "(or `pip install -e '.[deploy]'` there)")
    hosts = check_inventory(inventory_path, path, limit=limit, overrides=overrides)

    cmdline = []
    for extra in passed:
        cmdline += ["-e", extra]
    if check:
        cmdline.append("--check")
    if tags:
        cmdline += ["--tags", tags]
    if limit:
        cmdline += ["--limit", limit]
    if verbose > 1:
        cmdline.append("-" + "v" * (verbose - 1))

    with tempfile.TemporaryDirectory(prefix="dsaops-deploy-") as tmp:
        extravars = {}
        if print_commands:
            out = Path(tmp) / "commands"
            out.mkdir()
            extravars["sglang_server_print_dir"] = str(out)
        progress = Progress(quiet=print_commands, verbose=verbose > 0)
        result = ansible_runner.run(
            private_data_dir=tmp,
            project_dir=str(PLAYBOOKS),
            playbook="print-commands.yml" if print_commands else "cluster.yml",
            inventory=str(inventory_path),
            extravars=extravars,
            cmdline=shlex.join(cmdline) if cmdline else None,
            envvars={"ANSIBLE_CONFIG": str(PLAYBOOKS.parent / "ansible.cfg"), "PATH": path},
            quiet=True,
            event_handler=progress.on_event,
        )
        failed = result.rc != 0
        if failed and not progress.failures:
            # Ansible stopped before any task (YAML error, unknown host group): show its output.
            print(result.stdout.read()[-4000:], file=sys.stderr)
        if print_commands and not failed:
            print_rendered(out)
            return 0
        if not print_commands:
            print_summary(result.stats or {}, check=check, hosts=hosts)
        if failed:
            print(f"dsaops deploy: failed ({len(progress.failures)} failure(s) above); nothing after them ran",
                  file=sys.stderr)
        return 0 if not failed else 1


class Progress:
    """Turns ansible-runner events into one line per play, task result of interest, and failure."""

    def __init__(self, quiet: bool, verbose: bool):
        self.quiet, self.verbose = quiet, verbose
        self.failures: list[str] = []
        self.play: str | None = None   # printed with its first task: plays left without hosts stay silent

    def on_event(self, event: dict) -> bool:
        kind, data = event.get("event", ""), event.get("event_data", {})
        if kind == "playbook_on_play_start":
            self.play = data.get("play", "")
        elif kind == "playbook_on_task_start" and self.play is not None and not self.quiet:
            print(f"== {self.play}", flush=True)
            self.play = None
        elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res", {})
            # A looped task fails with "One or more items failed": the items carry the messages.
            items = [failure(r) for r in res.get("results", []) if r.get("failed") and r.get("msg")]
            message = " ".join(items) or failure(res) or res
            line = f"{data.get('host')}: {data.get('task')}: {message}"
            self.failures.append(line)
            print(f"   FAILED {line}", file=sys.stderr, flush=True)
        elif kind == "runner_on_ok" and not self.quiet:
            changed = data.get("res", {}).get("changed")
            if changed or self.verbose:
                print(f"   {'changed' if changed else 'ok':<8}{data.get('host')}: {data.get('task')}", flush=True)
        return True  # keep the event: the run's stats (the summary) are read back from the events


def failure(res: dict) -> str:
    """A failed task's message; for a command, its exit code and last lines of output, which say why where
    Ansible's message says only "non-zero return code" (`docker load`'s no space left, `hf download`'s 401)."""
    message = res.get("msg") or ""
    output = (res.get("stderr") or res.get("stdout") or "").strip().splitlines()
    if "rc" not in res or not output:
        return message or res.get("stderr") or ""
    said = " / ".join(line.strip()[:FAILURE_LINE_CHARS] for line in output[-FAILURE_LINES:])
    return f"{message} (exit {res['rc']}): {said}"


def print_summary(stats: dict, check: bool, hosts: set[str]) -> None:
    """One row per inventory host (the inventory check on the controller's localhost is not one)."""
    columns = (("ok", "ok"), ("changed", "changed"), ("failures", "failed"), ("dark", "unreachable"),
               ("skipped", "skipped"))
    shown = sorted({h for key, _ in columns for h in stats.get(key, {})} & hosts)
    print(f"\n{'host':<24}" + "".join(f"{title:>12}" for _, title in columns))
    for host in shown:
        print(f"{host:<24}" + "".join(f"{stats.get(key, {}).get(host, 0):>12}" for key, _ in columns))
    changes = sum(stats.get("changed", {}).get(host, 0) for host in shown)
    verb = "would change" if check else "changed"
    print(f"summary: {len(shown)} host(s), {verb} {changes} thing(s)"
          f"{'' if changes or check else ' (already as wanted)'}")


def print_rendered(folder: Path) -> None:
    """Each node's rendered server command, head first (ordered by node rank)."""
    def rank(path: Path) -> int:
        found = re.search(r"node rank (\d+) of", path.read_text())
        return int(found.group(1)) if found else 0

    for path in sorted(folder.glob("*.sh"), key=rank):
        print(f"# ---- {path.stem} ----")
        print(path.read_text().rstrip())
        print()
