"""The divergence locator: for one diverging row, run two passes side by side and name the first op whose
bits differ.

    python -m attnlab.locate <run folder> [--request N] [--batch B] [--against BACKEND] [overrides ...]

By default path A is decode-shaped (q_len 1 at each position, what target-only decoding ran) and path B
verify-shaped (one q_len k+1 pass holding the row, where the speculative run's verify pass held it, read
from the request's accept lengths); both on the run's target side (backend, dtype, fused ops, the launch
parameters its CUDA graphs use, batch padded to the graph bucket), both over the same prefix (one prefill of
the tokens before the verify pass, bitwise the same for both). Every op of every layer (attnlab.probe) is
compared row by row at each position from the verify pass's first row to the diverging one; the first
difference in dataflow order (layer, then op, then position) is what the report names. ``--against`` runs
path B on another verify backend at the same shape instead (e.g. torch vs triton); ``--divergence
noise_floor`` compares decode at batch 1 with decode at batch B.

Writes ``locate.json`` (every op at the diverging position, both argmaxes) into the run folder or --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.backends.base import Mode
from attnlab.errors import AttnlabError
from attnlab.probe import Recorder, Recording, RecordingContext, op_order

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_IDS = itertools.count()


@dataclass(frozen=True)
class Passes:
    """One side of the comparison: a runner, the passes after the shared prefix, the batch (copies of the
    request in every pass, as many rows as the run's GEMMs saw) and the graph bucket it pads to."""

    runner: object  # engine.runner.ModelRunner
    q_lens: tuple[int, ...]  # consecutive passes from ``start``
    batch: int = 1
    pad_to: int | None = None
    label: str = ""


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    it = _INT_OF_SIZE[x.element_size()]
    return torch.equal(x.contiguous().view(it), y.contiguous().view(it))


def _forward(runner, p, ids: torch.Tensor, recording: Recording | None) -> torch.Tensor:
    """runner.forward's eager path with a recording context; logits for every row of the pass (a graph
    replay computes the padded rows too)."""
    ctx = RecordingContext(runner.backend, runner.pool, p.slots, fused_ops=runner.fused_ops,
                           invariant=getattr(runner, "invariant", False), recording=recording)
    pad = p.positions.shape[0] - ids.shape[0]
    if pad > 0:
        ids = torch.cat([ids, ids.new_zeros(pad)])
    return runner.logits(runner.model(ids, p.positions, ctx))


@torch.inference_mode()
def record_passes(path: Passes, seq: list[int], start: int) -> list[Recording]:
    """Prefill ``seq[:start]`` (not recorded) into ``path.batch`` fresh requests, then the passes of
    ``path.q_lens`` tokens each, recorded; the requests are released after."""
    r = path.runner
    reqs = [("locate", next(_IDS)) for _ in range(path.batch)]
    ids = lambda a, b: torch.tensor(seq[a:b] * path.batch, dtype=torch.long, device=r.device)
    out = []
    try:
        with Recorder(r.model, r.fused_ops) as rec:
            if start:
                p = r.prepare(reqs, [0] * path.batch, [start] * path.batch, Mode.PREFILL)
                r.plan(p)
                _forward(r, p, ids(0, start), None)
            pos = start
            for q in path.q_lens:
                p = r.prepare(reqs, [pos] * path.batch, [q] * path.batch, Mode.DECODE if q == 1 else Mode.VERIFY,
                              pad_to=path.pad_to)
                r.plan(p)
                recording = Recording(positions=list(range(pos, pos + q)))
                rec.start(recording)
                _forward(r, p, ids(pos, pos + q), recording)
                rec.recording = None
                out.append(recording)
                pos += q
    finally:
        for req in reqs:
            r.release(req)
    return out


def _rows(recordings: list[Recording]) -> dict[int, tuple[Recording, int]]:
    """position -> (recording, row of the first copy of the request)."""
    return {pos: (rec, j) for rec in recordings for j, pos in enumerate(rec.positions)}


def _diff(x: torch.Tensor, y: torch.Tensor) -> dict:
    d = (x.float() - y.float()).abs()
    return {"elements_differ": int((x.float() != y.float()).sum()), "elements": x.numel(),
            "max_abs_diff": float(d.max()) if d.numel() else 0.0}


def _argmax_margin(logits_row: torch.Tensor) -> dict:
    v, i = logits_row.float().topk(2)
    return {"argmax": int(i[0]), "margin": float(v[0] - v[1])}


def locate(a: Passes, b: Passes, seq: list[int], start: int, position: int) -> dict:
    """Run both paths over ``seq`` from ``start`` and compare every op at every position ``start..position``.

    -> {"first": the first differing (op, layer, position) in dataflow order or None (bitwise identical),
        "at_position": every op at ``position``: equal or not, max |diff|, "logits": both argmaxes and margins}."""
    ra, rb = _rows(record_passes(a, seq, start)), _rows(record_passes(b, seq, start))
    positions = [p for p in range(start, position + 1) if p in ra and p in rb]
    if position not in positions:
        raise ValueError(f"position {position} is not in both paths (A has {sorted(ra)}, B has {sorted(rb)})")
    num_layers = len(a.runner.model.layers)
    first, at = None, []
    for op, layer in op_order(num_layers):
        for pos in positions:
            (rec_a, ja), (rec_b, jb) = ra[pos], rb[pos]
            if (op, layer) not in rec_a.ops or (op, layer) not in rec_b.ops:
                continue
            x, y = rec_a.ops[(op, layer)][ja], rec_b.ops[(op, layer)][jb]
            equal = same_bits(x, y)
            if first is None and not equal:
                first = {"op": op, "layer": layer, "position": pos, **_diff(x, y)}
            if pos == position:
                at.append({"op": op, "layer": layer, "equal": equal, **({} if equal else _diff(x, y))})
    (rec_a, ja), (rec_b, jb) = ra[position], rb[position]
    logits = {"a": _argmax_margin(rec_a.ops[("logits", None)][ja]),
              "b": _argmax_margin(rec_b.ops[("logits", None)][jb])}
    return {"a": a.label, "b": b.label, "start": start, "position": position, "positions": positions,
            "first": first, "at_position": at, "logits": logits}


def format_result(res: dict) -> str:
    """A few lines: the first difference, then a per-layer map of the ops at the diverging position."""
    lines = [f"A: {res['a']}", f"B: {res['b']}", f"positions {res['positions'][0]}..{res['position']} compared"]
    f = res["first"]
    if f is None:
        lines.append("bitwise identical: every op at every compared position")
    else:
        where = "" if f["layer"] is None else f"layer {f['layer']} "
        lines.append(f"first difference: {where}{f['op']} at position {f['position']}: {f['elements_differ']} of "
                     f"{f['elements']} elements differ, max |diff| {f['max_abs_diff']:.3g}")
    by_layer: dict = {}
    for e in res["at_position"]:
        by_layer.setdefault(e["layer"], []).append(e)
    lines.append(f"at position {res['position']} ('x' = bits differ):")
    for layer, ops in by_layer.items():
        name = "-" if layer is None else str(layer)
        lines.append(f"  {name:>3} " + " ".join(f"{e['op']}{'x' if not e['equal'] else '.'}" for e in ops))
    la, lb = res["logits"]["a"], res["logits"]["b"]
    lines.append(f"argmax A {la['argmax']} (margin {la['margin']:.4g}), B {lb['argmax']} (margin {lb['margin']:.4g})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# a run folder's divergence


def verify_row(accept_lens: list[int], d: int) -> int:
    """Row of output token ``d`` in the verify pass that emitted it: token 0 comes from prefill, then pass
    t emits accept_lens[t] tokens, its row r deciding output (tokens before it) + r."""
    emitted = 1
    for a in accept_lens:
        if d < emitted + a:
            return d - emitted
        emitted += a
    raise ValueError(f"output token {d} is past the {emitted} tokens the accept lengths account for")


class LocateError(AttnlabError):
    """The run folder, request or option the locator was given cannot be used: one line, exit code 2."""


class NothingToLocate(Exception):
    """The run's requests have no divergence for the chosen comparison: not an error (exit code 0)."""


def _index_of(row: dict, key: str) -> int | None:
    if key == "noise_floor":
        return (row.get("divergence_noise_floor") or {}).get("index")
    return row.get(f"first_divergence_{key}")


def _list(indices: list[int], most: int = 8) -> str:
    return ", ".join(map(str, indices[:most])) + (f" and {len(indices) - most} more" if len(indices) > most else "")


def pick_request(rows: list[dict], key: str, request: int | None) -> tuple[int, dict, int]:
    """(index, requests.jsonl row, output index of its first divergence) for ``key``'s comparison. A request
    out of range or without a divergence is a LocateError; no diverging request at all, NothingToLocate."""
    diverging = [i for i, row in enumerate(rows) if _index_of(row, key) is not None]
    which = f"requests that diverge ({key}): {_list(diverging)}" if diverging else f"no request diverges ({key})"
    if request is not None:
        if not 0 <= request < len(rows):
            raise LocateError(f"--request {request}: the run has {len(rows)} requests (0..{len(rows) - 1}); "
                              f"{which}")
        d = _index_of(rows[request], key)
        if d is None:
            raise LocateError(f"--request {request}: request {request} has no divergence ({key}) in "
                              f"requests.jsonl; {which}")
        return request, rows[request], d
    if not diverging:
        raise NothingToLocate(f"no request of {len(rows)} diverges ({key}) in requests.jsonl: nothing to locate")
    i = diverging[0]
    return i, rows[i], _index_of(rows[i], key)


def _status(run: Path) -> str:
    """' (status.json: failed: <error>)', or '' when it cannot be read."""
    try:
        st = json.loads((run / "status.json").read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(st, dict) or "status" not in st:
        return ""
    return f" (status.json: {st['status']}{': ' + str(st['error']) if st.get('error') else ''})"


# Settings whose default changed after runs were made: locate recomposes a run from its overrides and today's defaults,
# so it pins these to the run's own composed value (.hydra/config.yaml) where its overrides do not set them.
PINNED = ("engine.fused_ops",)  # default false until 2026-12-05, auto since


def _pinned_defaults(config: Path, overrides: list) -> list[str]:
    """``key=value`` overrides for the PINNED keys that ``overrides`` does not set, from the run's composed config
    (none where it has no such file or key: a run folder made by hand)."""
    import yaml

    set_keys = {str(o).split("=", 1)[0].lstrip("+~") for o in overrides}
    try:
        cfg = yaml.safe_load(config.read_text()) if config.is_file() else None
    except yaml.YAMLError:
        cfg = None
    out = []
    for key in PINNED:
        node = cfg
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if key not in set_keys and node is not None:
            out.append(f"{key}={str(node).lower() if isinstance(node, bool) else node}")
    return out


def read_run(run: Path, divergence: str = "vs_target_only") -> tuple[list[str], list[dict]]:
    """The run folder's saved overrides and requests.jsonl rows; LocateError (one line: what is wrong and what
    to pass instead) for a path that is not a finished run's folder."""
    import yaml

    hint = "pass the folder of one run (its hydra.run.dir, holding .hydra/ and requests.jsonl)"
    if not run.exists():
        raise LocateError(f"{run}: no such folder: {hint}")
    if not run.is_dir():
        raise LocateError(f"{run}: not a folder: {hint}")
    saved = run / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        jobs = sorted((p for p in run.iterdir() if (p / ".hydra" / "overrides.yaml").is_file()),
                      key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))
        if (run / "multirun.yaml").is_file() or (jobs and all(p.name.isdigit() for p in jobs)):
            names = _list([p.name for p in jobs]) if jobs else "none yet"
            raise LocateError(f"{run} is a sweep folder (job folders: {names}): pass one job folder"
                              + (f", e.g. {jobs[0]}" if jobs else ""))
        if jobs:
            raise LocateError(f"{run} holds {len(jobs)} run folders ({_list([p.name for p in jobs], 4)}): pass one "
                              f"of them, e.g. {jobs[0]}")
        raise LocateError(f"{run}: not a run folder (no .hydra/overrides.yaml): {hint}")
    try:
        overrides = yaml.safe_load(saved.read_text()) or []
    except yaml.YAMLError as e:
        raise LocateError(f"{saved}: not readable YAML ({str(e).splitlines()[0]}): the run folder is damaged") from e
    if not isinstance(overrides, list):
        raise LocateError(f"{saved}: not a list of overrides: the run folder is damaged")
    overrides = [*_pinned_defaults(run / ".hydra" / "config.yaml", overrides), *overrides]
    requests = run / "requests.jsonl"
    if not requests.is_file():
        raise LocateError(f"{run}: no requests.jsonl{_status(run)}: the locator needs a run that finished "
                          f"requests; pass a completed run's folder, or run it again")
    rows = []
    for n, line in enumerate(requests.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise LocateError(f"{requests}:{n}: not a JSON line ({e}): the run folder is damaged") from e
    if not rows:
        raise LocateError(f"{requests} holds no request{_status(run)}: nothing to locate; pass a run that "
                          f"finished requests")
    if not _compared(run, rows, divergence):
        if divergence == "noise_floor":
            why, how = "did not measure the noise floor", "parity.noise_floor=true"
        else:
            why = "did not compare its tokens with target-only (parity=off, parity.tokens=false or draft=none)"
            how = "parity.tokens=true and a drafter"
        raise LocateError(f"{run}: the run {why}, so requests.jsonl names no divergence: run it again with {how}")
    return [str(o) for o in overrides], rows


def _compared(run: Path, rows: list[dict], divergence: str) -> bool:
    """Whether the run compared tokens for ``divergence`` at all (else no divergence can have been found)."""
    if divergence != "noise_floor":
        return any(f"first_divergence_{divergence}" in row for row in rows)
    if any(row.get("divergence_noise_floor") for row in rows):
        return True
    try:
        parity = json.loads((run / "parity.json").read_text())
    except (OSError, ValueError):
        return True  # cannot tell: say "nothing to locate" rather than refuse
    return isinstance(parity, dict) and isinstance(parity.get("noise_floor"), dict)


def _int_at_least(least: int, why: str):
    """An argparse type: an int >= ``least``, else the one-line reason (``why``: what the number counts)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{n}: must be >= {least} ({why})")
        return n
    return parse


_positive_int = _int_at_least(1, "copies of the request in every pass")
_request_index = _int_at_least(0, "a request's line in requests.jsonl, from 0")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (``attnlab.locate: error: ...``) and exit code 2."""

    def error(self, message: str):
        print(f"attnlab.locate: error: {message}; see python -m attnlab.locate --help", file=sys.stderr)
        raise SystemExit(2)


def _out_path(out: str | None, run: Path) -> Path:
    """locate.json's path: ``--out`` (a file; an existing folder or one ending in / gets locate.json), else the
    run folder. LocateError now, before the passes run, where it could not be written."""
    if out is None:
        return run / "locate.json"
    path = Path(out)
    if out.endswith(("/", os.sep)) or path.is_dir():
        path = path / "locate.json"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise LocateError(f"--out {out}: {parent} is a file, not a folder: choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LocateError(f"--out {out}: {parent} is not writable: choose another path")
    return path


def main(argv: list[str] | None = None) -> int:
    from attnlab.cli import EXIT_USAGE, is_user_error, one_line

    ap = _Parser(prog="python -m attnlab.locate", description=" ".join(__doc__.split("\n\n")[0].split()),
                 epilog="Extra arguments are config overrides applied on top of the run's own (e.g. device=cpu). "
                        "Exit codes: 0 located (or no request diverges: nothing to locate), 1 a bug in attnlab, "
                        "2 a user error. docs/usage.md, 'Locating a divergence', says more.")
    ap.add_argument("run", type=Path, help="a run folder (with .hydra/ and requests.jsonl)")
    ap.add_argument("--request", type=_request_index, default=None,
                    help="request index, from 0 (default: the first that diverges)")
    ap.add_argument("--divergence", default="vs_target_only", choices=("vs_target_only", "noise_floor"),
                    help="which comparison's divergence: spec vs target-only (decode vs verify shape), or the "
                         "noise floor (decode at batch 1 vs at batch B)")
    ap.add_argument("--batch", type=_positive_int, default=None,
                    help="copies of the request per pass, >= 1 (default: the run's workload.batch_size; the noise "
                         "floor's path A is 1)")
    ap.add_argument("--against", default=None, help="path B on this verify backend, same shape as A")
    ap.add_argument("--out", default=None, help="where locate.json goes: a file, or a folder (created if missing; "
                                                "default: the run folder)")
    args, overrides = ap.parse_known_args(argv)
    flags = [o for o in overrides if o.startswith("-")]
    if flags:
        ap.error(f"unrecognized arguments: {' '.join(flags)} (overrides are key=value, e.g. device=cpu)")
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        out = _out_path(args.out, args.run)
        res = locate_run(args.run, overrides, args.request, args.divergence, args.batch, args.against)
    except NothingToLocate as e:
        print(f"attnlab.locate: {e}")
        return 0
    except Exception as e:
        if full or not is_user_error(e):
            raise
        print(f"attnlab.locate: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    print(format_result(res))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
    except OSError as e:
        print(f"attnlab.locate: error: --out {out}: cannot write it ({e.strerror or e}): choose another path",
              file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {out}")
    return 0


def locate_run(run: Path, overrides: list[str], request: int | None, divergence: str, batch: int | None,
               against: str | None) -> dict:
    """The run folder's divergence located (see the module doc)."""
    from attnlab.cli import add_free_form
    from attnlab.compose import compose
    from attnlab.config import validate
    from attnlab.engine.graphs import DEFAULT_BUCKETS, bucket_for
    from attnlab.prepare import prepare
    from attnlab.sides import build, side_spec

    run = Path(run)
    if batch is not None and batch < 1:
        raise LocateError(f"--batch {batch}: must be >= 1 (copies of the request in every pass)")
    saved, rows = read_run(run, divergence)
    # a bad override is reported whatever the requests hold; backend options / model overrides need no + (cli)
    plan = validate(compose([*saved, *add_free_form(list(overrides))]))
    i, row, d = pick_request(rows, divergence, request)
    work = prepare(plan)
    prompt = list(work.prompts[i].token_ids) if i < len(work.prompts) else None
    out = list(row["output_token_ids"])
    if prompt is None or len(prompt) != row["prompt_tokens"]:
        raise LocateError(f"request {i}: the prompts prepared now differ from the run's (another workload file, or "
                          f"a workload override?): locate with the run's own workload")
    position = len(prompt) + d - 1  # the input row whose logits chose output token d
    k = plan.k
    seq = prompt + out + [0] * (k + 1)  # rows after the diverging one: the run's own continuation (causally unseen)
    target = build(side_spec(plan, work, "target", plan.verify))  # graph launch parameters, run eagerly
    b_size = plan.workload.batch_size if batch is None else batch
    buckets = [x for x in DEFAULT_BUCKETS if x < plan.workload.batch_size]
    buckets.append(next((x for x in DEFAULT_BUCKETS if x >= plan.workload.batch_size), plan.workload.batch_size))
    pad = (lambda n: bucket_for(n, buckets)) if plan.engine.cuda_graph else (lambda n: None)
    desc = f"{plan.verify} {plan.precision.target}"
    if divergence == "noise_floor":
        a = Passes(target, (1,), 1, pad(1), f"decode (q_len 1) at batch 1 on {desc}")
        b = Passes(target, (1,), b_size, pad(b_size), f"decode (q_len 1) at batch {b_size} on {desc}")
        return {**locate(a, b, seq, position, position), "request": i, "output_index": d}
    if against:
        spec = side_spec(plan, work, "target", against, name="against")
        if spec.invariant:  # an invariant run against a backend without the mode: that backend as it normally runs
            from dataclasses import replace

            from attnlab.backends.registry import get_backend_class

            if not get_backend_class(against).capabilities().invariant:
                spec = replace(spec, invariant=False)
        other = build(spec, share_weights_with=target)
        a = Passes(target, (1,), b_size, pad(b_size), f"decode (q_len 1) at batch {b_size} on {desc}")
        b = Passes(other, (1,), b_size, pad(b_size), f"decode (q_len 1) at batch {b_size} on {against}")
        return {**locate(a, b, seq, position, position), "request": i, "output_index": d}
    j = verify_row(row["accept_lens"], d)
    start = position - j
    a = Passes(target, (1,) * (j + 1), b_size, pad(b_size),
               f"decode (q_len 1 per position) at batch {b_size} on {desc}")
    b = Passes(target, (k + 1,), b_size, pad(b_size), f"verify (q_len {k + 1}, row {j}) at batch {b_size} on {desc}")
    return {**locate(a, b, seq, start, position), "request": i, "output_index": d, "verify_row": j}


if __name__ == "__main__":
    sys.exit(main())
