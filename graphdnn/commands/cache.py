"""``graphdnn cache key|stats|ls|verify|clear|export|import|push|pull``: look after a plan cache."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..arch import resolve_arch
from ..cache.archive import export_cache, import_cache
from ..cache.container import EntryError
from ..cache.entries import KernelBinary, PlanEntry
from ..cache.evict import SizeCap
from ..cache.key import FORMAT_VERSION, key_fields
from ..cache.store import DiskStore, StoredFile
from ..cache.sync import pull, push
from ..cache.trust import check_kernels, trusted_kernel, trusted_plan
from ..files import load_graph
from ..names import printable
from . import add_cache_dir, add_remote, chosen_directory, chosen_remote, needed_remote, target


def add(commands: Any) -> None:
    cache = commands.add_parser(
        "cache", help="inspect, verify, clear, export or import the plan cache; push to or pull from a remote one"
    )
    actions = cache.add_subparsers(required=True, metavar="ACTION")

    key = actions.add_parser("key", help="print every field of a graph's plan-cache key, and the key")
    key.add_argument("file", metavar="FILE")
    key.add_argument(
        "--arch", type=target, default=None, help="target, e.g. sm_80 (default: the current GPU's, else sm_90)"
    )
    key.add_argument("--disable", action="append", default=[], metavar="RULE", help="fusion rule turned off")
    key.set_defaults(run=_key)

    for name, helptext, function in (
        ("stats", "entry counts and sizes", _stats),
        ("ls", "list the stored plans", _ls),
        ("verify", "check every entry (checksum, format, kernels of each plan); exit 1 if any is bad", _verify),
        ("clear", "remove every entry", _clear),
    ):
        action = actions.add_parser(name, help=helptext)
        add_cache_dir(action)
        action.set_defaults(run=function)
    add_remote(actions.choices["stats"])
    for name, helptext, function in (
        ("push", "add every valid entry to the remote cache (entries there are kept)", _push),
        ("pull", "add every valid entry of the remote cache to the directory", _pull),
    ):
        action = actions.add_parser(name, help=helptext)
        add_cache_dir(action)
        add_remote(action)
        action.set_defaults(run=function)
    verify = actions.choices["verify"]
    verify.add_argument("--remove", action="store_true", help="delete the bad entries (they are rebuilt when needed)")

    export = actions.add_parser("export", help="write every valid entry to one archive (.tar, .tar.gz)")
    export.add_argument("archive", metavar="ARCHIVE")
    add_cache_dir(export)
    export.set_defaults(run=_export)
    load_archive = actions.add_parser("import", help="add the entries of an exported archive")
    load_archive.add_argument("archive", metavar="ARCHIVE")
    add_cache_dir(load_archive)
    load_archive.set_defaults(run=_import)


def _store(args: argparse.Namespace) -> DiskStore:
    store = chosen_directory(args).store
    assert store is not None
    return store


def _key(args: argparse.Namespace) -> int:
    ir = load_graph(args.file)
    print(key_fields(ir, resolve_arch(args.arch), args.disable).describe())
    return 0


def _stats(args: argparse.Namespace) -> int:
    store = _store(args)
    files = list(store.files())
    print(f"plan cache {store.directory} (entry format v{FORMAT_VERSION})")
    for kind in ("plan", "kernel"):
        mine = [f for f in files if f.kind == kind]
        print(f"  {kind}s: {len(mine):6d}  {_size(sum(f.bytes for f in mine))}")
    print(f"  size cap:  {_cap(store.cap, sum(f.bytes for f in files))}")
    others = sorted(p.name for p in store.directory.glob("v*") if p.is_dir() and p != store.base)
    if others:
        print(f"  other format versions present (unused by this graphdnn): {printable(', '.join(others))}")
    remote = chosen_remote(args)
    if remote is None:
        return 0
    counts = {kind: sum(1 for _ in remote.keys(kind)) for kind in ("plan", "kernel")}
    if remote.off is None:
        print(f"remote cache {printable(remote.url)}: {counts['plan']} plans, {counts['kernel']} kernels")
    print(f"  {printable(remote.describe())}")
    return 0 if remote.off is None else 1


def _cap(cap: SizeCap | None, used: int) -> str:
    if cap is None:
        return "none (GRAPHDNN_CACHE_MAX_BYTES sets one: least recently used entries are evicted past it)"
    share = f"{used / cap.limit:.0%} used" if cap.limit else "everything written is evicted"
    over = "; over it: the next write evicts" if used > cap.limit else ""
    return f"{_size(cap.limit)} (GRAPHDNN_CACHE_MAX_BYTES), {share}, least recently used evicted first{over}"


def _ls(args: argparse.Namespace) -> int:
    store = _store(args)
    print(f"{'key':<18} {'graph':<28} {'arch':<6} {'kernels':>7} {'workspace':>10}  created")
    for stored in store.files():
        if stored.kind != "plan":
            continue
        try:
            entry = trusted_plan(_read(store, stored), stored.key)
        except EntryError as error:
            print(f"{printable(stored.key[:16])}…  BAD: {printable(str(error))}")
            continue
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.created))
        tuned = f"  tuned on {printable(entry.tuned_on)}" if entry.tuned_on is not None else ""
        print(
            f"{stored.key[:16]}…  {printable(entry.graph_name)[:28]:<28} {entry.fields.arch:<6} "
            f"{len(entry.program.kernel_keys):>7} {_size(entry.program.workspace_size):>10}  {created}{tuned}"
        )
    return 0


def _verify(args: argparse.Namespace) -> int:
    store = _store(args)
    bad: list[tuple[StoredFile, str]] = []
    kernels: dict[str, KernelBinary] = {}
    plans: list[tuple[StoredFile, PlanEntry]] = []
    for stored in store.files():
        try:
            data = _read(store, stored)
            if stored.kind == "plan":
                plans.append((stored, trusted_plan(data, stored.key)))
            else:
                kernels[stored.key] = trusted_kernel(data, stored.key)
        except EntryError as error:
            bad.append((stored, str(error)))
    for stored, entry in plans:
        absent = [k for k in entry.program.kernel_keys if k not in kernels]
        try:
            if absent:
                raise EntryError(f"uses {len(absent)} kernel(s) missing or bad in the cache")
            check_kernels(entry, kernels)
        except EntryError as error:
            bad.append((stored, str(error)))
    unremoved = 0
    for stored, reason in bad:
        print(f"BAD {stored.kind} {printable(str(stored.path))}: {printable(reason)}")
        failure = store.remove(stored.path) if args.remove else None
        if failure is not None:
            unremoved += 1
            print(f"  could not remove it: {failure.strerror or failure}", file=sys.stderr)
    left = f", {unremoved} of them could not be removed" if unremoved else ""
    print(f"verified {len(plans)} plans and {len(kernels)} kernels in {store.directory}: {len(bad)} bad{left}")
    return 1 if bad else 0


def _clear(args: argparse.Namespace) -> int:
    store = _store(args)
    removed, failed = store.clear()
    for path, reason in failed:
        print(f"graphdnn: error: cannot remove {printable(str(path))}: {reason}", file=sys.stderr)
    left = f"; {len(failed)} could not be removed" if failed else ""
    print(f"removed {removed} entries from {store.directory}{left}")
    return 1 if failed else 0


def _export(args: argparse.Namespace) -> int:
    store = _store(args)
    print(f"exported {export_cache(store, args.archive)} from {store.directory} to {args.archive}")
    return 0


def _import(args: argparse.Namespace) -> int:
    store = _store(args)
    report = import_cache(store, args.archive)
    print(f"imported {report} from {args.archive} into {store.directory}")
    return 1 if report.failed else 0


def _push(args: argparse.Namespace) -> int:
    store, remote = _store(args), needed_remote(args)
    print(f"pushed {push(store, remote)} from {store.directory} to {printable(remote.url)}")
    return 0


def _pull(args: argparse.Namespace) -> int:
    store, remote = _store(args), needed_remote(args)
    report = pull(store, remote)
    print(f"pulled {report} from {printable(remote.url)} into {store.directory}")
    return 1 if report.failed else 0


def _read(store: DiskStore, stored: StoredFile) -> bytes:
    try:
        return store.read_bytes(stored.path)
    except FileNotFoundError:
        raise EntryError("removed while being read") from None


def _size(nbytes: float) -> str:
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KiB", "MiB"):
        nbytes /= 1024
        if nbytes < 1024:
            return f"{nbytes:.1f} {unit}"
    return f"{nbytes / 1024:.1f} GiB"
