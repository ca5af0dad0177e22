"""`dsaops image plan|build --arch T`: the serving image's build, composed from the targets table.

`make image-plan` / `make image` call this. Every target fact (base image, platform, arch
list, fp8 dtype, whether the base carries SGLang) comes from dsaops/targets.toml, the SGLang
pin from dsaops/pins.toml, the patch-series hash from the patch tool; nothing is copied into a
bake file.
The build context is a staged folder (default images/context/, ignored by git) holding the
two wheels and the entrypoint, so no RUN step needs to fetch the project or SGLang.
"""
from __future__ import annotations

import datetime
import email.parser
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from dsaops import build_host, image_base, pins, wheel_tags
from dsaops.cache import cache_dir, locked
from dsaops.errors import UserError
from dsaops.inventory_checks import ENV_NAME, IMAGE_REFERENCE

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "images"
DOCKERFILE = IMAGES / "Dockerfile"
IMAGE_NAME = "dsaops/sglang"
STAGES = ("python", "engine", "patched", "app", "kernels", "runtime")
# The oldest glibc an image base may have (Ubuntu 24.04 has 2.39): the wheels PyPI has are manylinux_2_34.
IMAGE_GLIBC = (2, 34)
# How much of a wheel's METADATA is read: its headers (Name, Version) come before the long description.
METADATA_HEAD_BYTES = 1 << 20


@dataclass
class Plan:
    target: object  # dsaops.targets.Target
    image: str
    context: Path
    build_args: dict[str, str]
    commands: list[list[str]]
    notes: list[str]

    @property
    def base_carries_sglang(self) -> bool:
        """The target's fact, or the --build-arg that overrides it: whether the build stages a wheel."""
        return self.build_args["BASE_CARRIES_SGLANG"] == "true"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], check=False, capture_output=True, text=True,
                             timeout=30)
    except OSError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _source_url() -> str:
    """origin's URL without the user and password a clone's URL may carry: the label ships with the image."""
    url = _git("remote", "get-url", "origin")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url


def _target(name: str):
    from dsaops import targets

    if not name:
        raise UserError(f"ARCH= (--arch) is required; valid targets: {', '.join(targets.table())}")
    return targets.get(name)


def build_args(target, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The Dockerfile's build arguments for `target`; `extra` adds or overrides (e.g. a local base)."""
    from dsaops import __version__
    from dsaops.sglang_patches.series import load

    args = {
        "BASE_IMAGE": target.base_image,
        "BASE_CARRIES_SGLANG": "true" if target.base_carries_sglang else "false",
        "SGLANG_VERSION": pins.SGLANG,
        "PATCH_SERIES_SHA256": load().sha256,
        "DSAOPS_TARGET": target.name,
        "TORCH_CUDA_ARCH_LIST": target.torch_cuda_arch_list,
        "PYTORCH_ROCM_ARCH": target.gpu_arch if target.vendor == "amd" else "",
        "FP8_DTYPE": target.fp8_dtype,
        "IMAGE_UID": str(target.image_uid),
        "DSAOPS_VERSION": __version__,
        "SOURCE_URL": _source_url(),
        "REVISION": _git("describe", "--always", "--dirty", "--abbrev=40"),
        "CREATED": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return args | (extra or {})


def image_name(target_name: str, *, registry: str = "", tag: str = "") -> str:
    """The serving image's name: [REGISTRY/]dsaops/sglang:TAG, TAG by default <sglang pin>-<target>
    (what `make image` tags and the playbooks run)."""
    repo_name = f"{registry.rstrip('/')}/{IMAGE_NAME}" if registry else IMAGE_NAME
    return f"{repo_name}:{tag or f'{pins.SGLANG}-{target_name}'}"


def detect_builder() -> str:
    """`buildx` where the docker CLI has the plugin, else `docker` (plain `docker build`)."""
    return "buildx" if shutil.which("docker") and build_host.has_buildx() else "docker"


def plan(name: str, *, tag: str = "", registry: str = "", push: bool = False, builder: str = "auto",
         context: Path | None = None, stage: str = "runtime", extra_args: dict[str, str] | None = None,
         offline: bool = False, standin: bool = False) -> Plan:
    """The exact commands `dsaops image build` runs; raises on a bad target or option. `standin`: on
    the target's stand-in base (dsaops/image_base.py): its Python, this machine's platform, no network."""
    target = _target(name)
    if standin:
        extra_args = image_base.build_args(target) | (extra_args or {})
        tag, offline = tag or f"{pins.SGLANG}-{target.name}-standin", True
        target = image_base.on_standin(target)
    if push and not registry:
        raise UserError("PUSH=1 needs REGISTRY= (e.g. REGISTRY=registry.example.com/team); "
                        f"without it the push would go to Docker Hub's {IMAGE_NAME}")
    if stage not in STAGES:
        raise UserError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    # checked here: Docker refuses such a name only once the build starts, or the push after it
    if tag and ("@" in tag or not IMAGE_REFERENCE.fullmatch(f"{IMAGE_NAME}:{tag}")):
        raise UserError(f"--tag (TAG=) {tag!r} is not a Docker tag: use at most 128 letters, digits, '_', '.' "
                        "and '-', not starting with '.' or '-', e.g. nightly-sm_90")
    if registry and not IMAGE_REFERENCE.fullmatch(f"{registry.rstrip('/')}/{IMAGE_NAME}"):
        raise UserError(f"--registry (REGISTRY=) {registry!r} is not a registry prefix Docker takes: use lowercase "
                        "HOST[:PORT][/NAMESPACE], e.g. registry.example.com:5000/team")
    image = image_name(target.name, registry=registry, tag=tag)
    context = Path(context or IMAGES / "context")
    args = build_args(target, extra_args)
    if target.base_carries_sglang and args["BASE_CARRIES_SGLANG"] == "false":
        raise UserError(f"--build-arg BASE_CARRIES_SGLANG=false: {target.name}'s image runs the SGLang its base "
                        "carries, and the targets table names no Python to pick a wheel for; leave it out")
    builder = detect_builder() if builder == "auto" else builder

    # The Dockerfile bind-mounts the wheels (RUN --mount), which needs BuildKit: Docker 20.10's own
    # client uses it when asked; a newer client without buildx then says to install buildx.
    cmd = ["docker", "buildx", "build"] if builder == "buildx" else ["env", "DOCKER_BUILDKIT=1", "docker", "build"]
    cmd += ["--platform", target.platform, "--file", str(DOCKERFILE), "--target", stage]
    if offline:  # RUN steps get no network: proves the stages built need none
        cmd += ["--network", "none"]
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    cmd += ["--tag", image]
    commands = []
    if builder == "buildx":
        commands.append([*cmd, "--push" if push else "--load", str(context)])
    else:
        commands.append([*cmd, str(context)])
        if push:
            commands.append(["docker", "push", image])

    notes = []
    if target.platform != (host := image_base.platform()):
        notes.append(f"this host is {host}: building {target.platform} runs every RUN step under QEMU "
                     f"emulation (hours, and binfmt_misc must be set up); build on a {target.platform} machine "
                     f"instead (for sm_121: on the DGX Spark itself)")
    return Plan(target, image, context, args, commands, notes)


_FLAGS = {"--push", "--load"}  # options without a value


def shell_lines(cmd: list[str]) -> str:
    """One command as copy-pastable shell: each option and its value on a line of its own."""
    parts, i = [], 0
    while i < len(cmd) and not cmd[i].startswith("--"):
        i += 1
    parts.append(shlex.join(cmd[:i]))
    while i < len(cmd):
        takes_value = cmd[i].startswith("--") and cmd[i] not in _FLAGS and i + 1 < len(cmd)
        parts.append(shlex.join(cmd[i:i + 2] if takes_value else cmd[i:i + 1]))
        i += 2 if takes_value else 1
    return " \\\n    ".join(parts)


def render(p: Plan) -> str:
    t = p.target
    sglang = "empty: the base carries SGLang" if p.base_carries_sglang else \
        f"the sglang cp{t.image_python.replace('.', '')} {build_host.machine_of(t.platform)} wheel"
    lines = [
        f"# dsaops image plan: {t.name} ({t.description})",
        f"#   platform  {t.platform}",
        f"#   base      {t.base_image}",
        f"#   image     {p.image}",
        f"#   context   {p.context}: entrypoint.sh, dsaops/ (the project's wheel), sglang/ ({sglang})",
        *(f"# note: {n}" for n in p.notes),
    ]
    return "\n".join(lines + [shell_lines(cmd) for cmd in p.commands])


def _pip(*args: str, env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def _image_tags(target) -> list[wheel_tags.Tag]:
    """The wheel tags the image's Python installs, best first."""
    return wheel_tags.linux_cpython_tags(target.image_python, build_host.machine_of(target.platform), IMAGE_GLIBC)


def sglang_wheel_for(target, pin: str) -> Path:
    """The pinned SGLang wheel for the target's Python and machine, downloaded once into the cache.

    The cache also holds the wheels other interpreters use (the tests take the host's): the choice
    goes by the tags in the file names, never by which file a glob lists first. A cached wheel is
    taken only whole (wheel_problem) and with its pinned sha256 (pins.check_wheel); a download lands
    beside it and moves in by rename, once both hold."""
    machine = build_host.machine_of(target.platform)
    accepted = _image_tags(target)
    wheels = cache_dir("wheels")
    pattern = f"sglang-{pin}-*.whl"
    found = wheel_tags.best(wheels.glob(pattern), accepted)
    if found is not None and not wheel_problem(found, target, pin):
        return pins.check_wheel(found)
    try:
        with locked("wheels", ".sglang.lock"):
            found = wheel_tags.best(wheels.glob(pattern), accepted)   # as another run may have left it
            if found is not None and not (problem := wheel_problem(found, target, pin)):
                return pins.check_wheel(found)
            if found is not None:
                if found.is_dir() and not found.is_symlink():
                    raise UserError(f"{found} is a folder where the cache keeps a wheel: remove it")
                print(f"dsaops image: {found}{problem}; downloading it again", file=sys.stderr)
                found.unlink(missing_ok=True)
            with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
                try:
                    _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
                         "--python-version", target.image_python, "--platform",
                         f"manylinux_{IMAGE_GLIBC[0]}_{IMAGE_GLIBC[1]}_{machine}", f"sglang=={pin}", "-d", tmp)
                except subprocess.CalledProcessError:
                    raise UserError(f"pip could not download sglang {pin} (above); reach a package index "
                                    "(PIP_INDEX_URL) or pass --sglang-wheel FILE") from None
                got = wheel_tags.best(Path(tmp).glob(pattern), accepted)
                if got is None:
                    raise UserError(f"pip found no sglang {pin} wheel for CPython {target.image_python} on {machine}; "
                                    "pass --sglang-wheel FILE")
                if problem := wheel_problem(got, target, pin):
                    raise UserError(f"pip's download {got.name}{problem}; pass --sglang-wheel FILE")
                os.replace(pins.check_wheel(got, downloaded=True), wheels / got.name)
    except OSError as e:   # a read-only cache, a full disk, a folder under the wheel's name
        raise UserError(f"cannot keep the sglang wheel in {wheels} ({e.strerror or e}): make it writable, "
                        "set DSAOPS_CACHE to a folder you may write, or pass --sglang-wheel FILE") from None
    return wheels / got.name


def wheel_problem(path: Path, target, pin: str, *, own_base: bool = False) -> str:
    """'' when `path` is the whole pinned SGLang wheel that the image's Python (`target`) installs,
    else what is wrong, to follow its name (": no such file", " is sglang 0.5.1, not ..."). The
    engine stage's pip refuses such a file only minutes into the build; its glob wants
    sglang-PIN-*.whl. `own_base`: a --build-arg BASE_IMAGE, whose Python the table does not know,
    so only the wheel's platform is checked."""
    python = "the base's CPython" if own_base else f"CPython {target.image_python}"
    if not path.is_file():
        return ": no such file"
    try:
        name, version, tags = wheel_tags.parse(path.name)
    except ValueError:
        return " is not a wheel's name (name-version[-build]-python-abi-platform.whl)"
    if (name, version) != ("sglang", pin):
        return f" is {name} {version}, not sglang {pin}"
    accepted = _image_tags(target)
    # the platforms CPython takes on a machine are the same for every version
    fits = {t[2] for t in tags} & {t[2] for t in accepted} if own_base else tags & set(accepted)
    if not fits:
        return (f": its tags {' '.join(sorted('-'.join(t) for t in tags))} do not install on {python} "
                f"on {build_host.machine_of(target.platform)}")
    try:
        with zipfile.ZipFile(path) as whl:
            metadata = [i for i in whl.infolist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename)]
            if len(metadata) != 1:
                return f" holds {'no' if not metadata else len(metadata)} *.dist-info/METADATA, a wheel holds one"
            if bad := whl.testzip():   # a cut-short or damaged file: pip would find it out minutes into the build
                return f": {bad} in it fails its checksum (a damaged file)"
            with whl.open(metadata[0]) as f:
                head = f.read(METADATA_HEAD_BYTES)
    except zipfile.BadZipFile as e:
        return f" is not a wheel: not a zip archive ({e})"
    except (OSError, EOFError, RuntimeError, zlib.error) as e:   # RuntimeError: encrypted or unknown compression
        return f": cannot read its METADATA ({e})"
    headers = email.parser.BytesHeaderParser().parsebytes(head)
    said = (str(headers.get("Name", "")).strip(), str(headers.get("Version", "")).strip())
    if (said[0].lower(), said[1]) != ("sglang", pin):   # pip's PEP 503 name compare, for a name with no -_.
        return f": its METADATA says {said[0] or 'no Name'} {said[1] or 'no Version'}, its name sglang {pin}"
    return ""


def check_sglang_wheel(path: Path, target, pin: str, *, own_base: bool = False) -> Path:
    """`path` (--sglang-wheel), when wheel_problem finds nothing wrong with it; else a UserError."""
    if problem := wheel_problem(path, target, pin, own_base=own_base):
        python = "the base's CPython" if own_base else f"CPython {target.image_python}"
        raise UserError(f"--sglang-wheel {path}{problem}; give the sglang {pin} wheel for {python} on "
                        f"{build_host.machine_of(target.platform)} (manylinux_{IMAGE_GLIBC[0]}_{IMAGE_GLIBC[1]} "
                        "or older), or leave --sglang-wheel out to download it")
    return path


def source_files() -> list[str]:
    """The project's files as git sees them (tracked and new, not ignored): what goes into the wheel."""
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if not listed:
        raise UserError(f"{REPO} is not a git checkout: build the image from a clone of the repository")
    return [f for f in listed.split("\0") if f and (REPO / f).is_file()]


def build_wheel(dest: Path) -> Path:
    """The project's wheel, built from a clean copy of its sources (a stale build/ folder cannot leak in)."""
    # A fixed timestamp makes the wheel identical for identical sources, so Docker's layer cache holds.
    env = os.environ | {"SOURCE_DATE_EPOCH": _git("log", "-1", "--format=%ct") or "315532800"}
    with tempfile.TemporaryDirectory(prefix="dsaops-src-") as tmp:
        for rel in source_files():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, Path(tmp) / rel)
        _pip("wheel", "-q", "--no-deps", "-w", str(dest), tmp, env=env)
    return next(dest.glob("dsaops-*.whl"))


CONTEXT_ENTRIES = ("entrypoint.sh", "dsaops", "sglang")


def stage_context(context: Path, sglang_wheel: Path | None) -> None:
    """Fill the build context: the entrypoint, the project's wheel, and the SGLang wheel (if any).

    Only a folder that is empty or holds a context staged before is emptied: a mistyped
    --context must not cost anyone their files.
    """
    foreign = sorted(e.name for e in context.iterdir() if e.name not in CONTEXT_ENTRIES) if context.is_dir() else []
    if foreign or (context.exists() and not context.is_dir()):
        raise UserError(f"--context {context} holds other things ({', '.join(foreign) or 'it is a file'}); "
                        "give an empty or new folder, or one an earlier `dsaops image build` staged")
    for name in CONTEXT_ENTRIES:
        entry = context / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
    (context / "sglang").mkdir(parents=True)
    shutil.copy2(IMAGES / "entrypoint.sh", context / "entrypoint.sh")
    build_wheel(context / "dsaops")
    if sglang_wheel:
        shutil.copy2(sglang_wheel, context / "sglang" / sglang_wheel.name)


def add_parser(sub) -> None:
    p = sub.add_parser("image", help="plan or build the serving image for a target (make image ARCH=...)",
                       description=__doc__.splitlines()[0])
    p.set_defaults(func=lambda args: p.print_help() or 2)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    base = actions.add_parser("base", help="make a stand-in base image here, to build without a registry",
                              description=image_base.__doc__.split("\n\n")[0])
    base.add_argument("--arch", required=True, metavar="TARGET", help="sm_90, sm_121 or gfx942")
    base.set_defaults(func=image_base.run)
    for action, text in (("plan", "print the exact build command and its arguments; builds nothing"),
                         ("build", "stage the build context and run the build")):
        a = actions.add_parser(action, help=text, description=text)
        a.add_argument("--arch", required=True, metavar="TARGET", help="sm_90, sm_121 or gfx942")
        a.add_argument("--tag", default="", help="image tag (default: <sglang pin>-<target>)")
        a.add_argument("--registry", default="", help="registry/namespace prefix for the image name")
        a.add_argument("--push", action="store_true", help="push the image (needs --registry)")
        a.add_argument("--builder", choices=("auto", "buildx", "docker"), default="auto",
                       help="`docker buildx build` or plain `docker build` (default: buildx where installed)")
        a.add_argument("--stage", choices=STAGES, default="runtime", help="last Dockerfile stage to build")
        a.add_argument("--context", type=Path, help="build context folder (default: images/context)")
        a.add_argument("--offline", action="store_true",
                       help="RUN steps without network (for stages whose base already has what they need)")
        a.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="add or override a build argument (e.g. a locally made BASE_IMAGE)")
        a.add_argument("--base", choices=("target", "standin"), default="target",
                       help="standin: build on the stand-in base `dsaops image base` makes (no registry, no network)")
        if action == "build":
            a.add_argument("--sglang-wheel", type=Path,
                           help="use this SGLang wheel (the pinned version, for the image's Python) instead of "
                                "downloading one; not where the base carries SGLang (gfx942)")
        a.set_defaults(func=run)


def dockerfile_args() -> list[str]:
    """The build arguments images/Dockerfile declares (its ARG lines), each once, in order."""
    lines = DOCKERFILE.read_text().splitlines()
    return list(dict.fromkeys(line.split()[1].split("=")[0] for line in lines if line.startswith("ARG ")))


def _parse_build_args(pairs: list[str]) -> dict[str, str]:
    bad = [p for p in pairs if "=" not in p or not ENV_NAME.fullmatch(p.split("=", 1)[0])]
    if bad:
        raise UserError(f"--build-arg takes KEY=VALUE, KEY of letters, digits and '_' not starting with a digit; "
                        f"not {', '.join(map(repr, bad))}")
    given = dict(p.split("=", 1) for p in pairs)
    # Docker only warns about an argument no ARG takes, then builds without it (a misspelt SGLANG_DEPS
    # downloads SGLang's dependencies); a bad SGLANG_DEPS fails only after the `python` stage has built.
    if unknown := [key for key in given if key not in dockerfile_args()]:
        raise UserError(f"--build-arg {', '.join(unknown)}: images/Dockerfile takes no such argument; "
                        f"check the spelling (it takes {', '.join(dockerfile_args())})")
    if given.get("SGLANG_DEPS", "pypi") not in ("pypi", "none"):
        raise UserError(f"--build-arg SGLANG_DEPS takes pypi or none, not {given['SGLANG_DEPS']!r}")
    if given.get("BASE_CARRIES_SGLANG", "false") not in ("true", "false"):
        raise UserError(f"--build-arg BASE_CARRIES_SGLANG takes true or false, not {given['BASE_CARRIES_SGLANG']!r}")
    return given


def run(args) -> int:
    standin, given = args.base == "standin", _parse_build_args(args.build_arg)
    p = plan(args.arch, tag=args.tag, registry=args.registry, push=args.push, builder=args.builder,
             context=args.context, stage=args.stage, extra_args=given, offline=args.offline, standin=standin)
    if args.action == "plan":
        print(render(p))
        return 0
    # checked before the stand-in base or the context is made: pip in the engine stage finds it out only minutes in
    wheel = args.sglang_wheel
    if wheel and p.base_carries_sglang:
        raise UserError(f"--sglang-wheel {wheel}: {p.target.name}'s base {p.build_args['BASE_IMAGE']} carries SGLang "
                        "and the image uses that one, installing no wheel; leave --sglang-wheel out")
    if wheel:
        wheel = check_sglang_wheel(wheel, p.target, p.build_args["SGLANG_VERSION"], own_base="BASE_IMAGE" in given)
    if standin:
        image_base.ensure(p.target)
    return build(p, sglang_wheel=wheel)


def build(p: Plan, *, sglang_wheel: Path | None = None) -> int:
    """Stage the context (the SGLang wheel: `sglang_wheel`, one check_sglang_wheel took, else the pinned
    one from the index) and run the plan's commands: 0 when the image was built, else the failing
    command's exit code."""
    missing = build_host.problems(base=p.build_args["BASE_IMAGE"], platform=p.target.platform,
                                  host_platform=image_base.platform(), uses_buildx=p.commands[0][:2] == ["docker", "buildx"])
    if missing:
        raise UserError("\n".join(missing))
    for note in p.notes:
        print(f"dsaops image: note: {note}", file=sys.stderr)
    wheel = None
    if not p.base_carries_sglang:
        wheel = sglang_wheel or sglang_wheel_for(p.target, p.build_args["SGLANG_VERSION"])
    stage_context(p.context, wheel)
    for cmd in p.commands:
        print("+ " + shlex.join(cmd), file=sys.stderr)
        rc = subprocess.run(cmd, check=False).returncode
        if rc:
            print(f"dsaops image: `{shlex.join(cmd[:3])}` failed (exit {rc}); the log above says where",
                  file=sys.stderr)
            return rc
    print(f"built {p.image}")
    return 0
