"""``cotrain --self-test``: prove that an installed Cotrain has every piece it needs.

A frozen bundle can miss a shared library, a Qt plugin or a data file that only the code
path using it notices. Each check here runs that code path for real, on this machine, and
prints one line; the exit status is non-zero if any check failed.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from engine.transport.without_media import media_codecs_loaded

Check = Callable[[], str]


def check_training() -> str:
    import torch

    from engine.tasks import create_task, initial_model

    params = dict(d_model=32, heads=2, ff=64, layers=2, embedding=16, seq_len=16, micro_batch=4)
    task = create_task("demo-lm", params)
    model = initial_model(task, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = task.batch(seed=1, index=0)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = task.loss(model, batch)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    if not losses[-1] < losses[0]:
        raise RuntimeError(f"loss did not fall: {losses}")
    return f"demo-lm step, loss {losses[0]:.3f} -> {losses[-1]:.3f} (torch {torch.__version__})"


def check_models() -> str:
    """What projects with data use: a transformers model from a configuration, a tokenizer
    from JSON (the tokenizers library) and an image decoded by Pillow."""
    import io

    import huggingface_hub
    import tokenizers
    import torch
    import transformers
    from PIL import Image

    from engine.tasks.hf_models import build_model, model_config

    config = dict(vocab_size=8, embedding_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32, max_position_embeddings=16)
    model = build_model("pretraining", model_config("pretraining", "albert", config))
    vocabulary = {"[UNK]": 0, "a": 1, "b": 2}
    made = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="[UNK]"))
    made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    ids = tokenizers.Tokenizer.from_str(made.to_str()).encode("a b c").ids
    if ids != [1, 2, 0]:
        raise RuntimeError(f"the tokenizer read back from JSON gave {ids}")
    png = io.BytesIO()
    Image.new("L", (4, 4), 255).save(png, "PNG")
    with Image.open(io.BytesIO(png.getvalue()), formats=["PNG"]) as image:
        image.load()
    tokens = torch.tensor([ids * 4])
    loss = model(input_ids=tokens, labels=tokens, sentence_order_label=torch.tensor([0])).loss
    loss.backward()
    if not torch.isfinite(loss):
        raise RuntimeError(f"the model's loss is {float(loss)}")
    if not huggingface_hub.is_offline_mode():
        raise RuntimeError("the model hub is reachable: a project could make this computer fetch code")
    return (f"ALBERT from a configuration (transformers {transformers.__version__}), a tokenizer from JSON "
            f"(tokenizers {tokenizers.__version__}), a PNG decoded, the model hub off")


def check_webrtc() -> str:
    from engine.aio import run

    return run(_webrtc_round_trip())


async def _webrtc_round_trip() -> str:
    from engine.aio import spawn
    from engine.transport.backends import native_problem, restrict_host_addresses
    from engine.transport.ice import ice_configuration
    from engine.transport.mailbox import Key, Mailbox
    from engine.transport.mesh import PeerMesh
    from engine.wire.control import SignalData
    from engine.wire.frames import Part
    from engine.wire.framing import Frame
    from engine.wire.types import Transport

    restrict_host_addresses(["127.0.0.1"])
    meshes: dict[str, PeerMesh] = {}
    boxes = {name: Mailbox() for name in ("a", "b")}

    def relay(sender: str):
        async def send(target: str, data: SignalData) -> None:
            spawn(meshes[target].handle_signal(sender, data))
        return send

    def deliver(box: Mailbox) -> Callable[[str, Frame], None]:
        return lambda sender, frame: box.put(Key("part", 1, (), sender), frame)

    for name, box in boxes.items():
        meshes[name] = PeerMesh(name, relay(name), ice_configuration([]), box, deliver(box),
                                connect_timeout=15)
        if native_problem() is None:  # prove the native stack works, whatever links default to
            meshes[name].transports = [Transport.NATIVE]
    try:
        began = time.monotonic()
        link = await meshes["a"].link("b")
        payload = os.urandom(300_000)  # more than one 256 KiB chunk
        await link.send(Part(round_id=1, epoch=0, index=0, samples=1, loss_sum=0.0), payload)
        got = await boxes["b"].get(Key("part", 1, (), "a"), timeout=15)
        back = await meshes["b"].link("a")
        await back.send(Part(round_id=1, epoch=0, index=1, samples=1, loss_sum=0.0), bytes(got.payload))
        echoed = await boxes["a"].get(Key("part", 1, (), "b"), timeout=15)
        if bytes(echoed.payload) != payload:
            raise RuntimeError("the echoed bytes differ")
        media = "PyAV present" if media_codecs_loaded() else "data channels only, no PyAV"
        stack = link.transport.value
        problem = native_problem()
        if problem:
            stack += f"; fast data channels unavailable: {problem}"
        return (f"loopback data channel round trip of 300 kB in {time.monotonic() - began:.2f} s "
                f"on {stack} ({media})")
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


def check_keyring() -> str:
    import keyring
    from keyring.errors import KeyringError, NoKeyringError

    backend = keyring.get_keyring()
    name = f"{type(backend).__module__}.{type(backend).__name__}"
    try:
        keyring.get_password("cotrain-self-test", "probe")
    except NoKeyringError:
        return f"no OS keyring ({name}): logins are kept in a 0600 file, as Cotrain says when it does"
    except KeyringError as exc:
        return f"{name} present but refused a read ({exc}); logins fall back to a 0600 file"
    return f"{name} answers"


def check_zeroconf() -> str:
    import zeroconf
    from zeroconf import ServiceInfo

    from engine.lan.records import SERVICE_TYPE, encode_properties

    info = ServiceInfo(SERVICE_TYPE, f"self-test.{SERVICE_TYPE}", port=8470,
                       properties=encode_properties({"demo-lm": "Demo"}), parsed_addresses=["127.0.0.1"])
    if not info.properties:
        raise RuntimeError("records did not encode")
    return f"zeroconf {zeroconf.__version__} loaded"


CHECKS: list[tuple[str, Check]] = [
    ("webrtc", check_webrtc),
    ("keyring", check_keyring),
    ("zeroconf", check_zeroconf),
    ("training", check_training),
    ("models", check_models),
]
# Importing torch, and the torch._dynamo that torch.optim imports on its first step, takes
# most of the self-test's time: this check runs in a child process while the others run
# here. On two cores that takes about a second and a half off a cold start.
# The models' libraries take as long again to import: another child, on the other core.
IN_CHILD = ("training", "models")
CHILD_TIMEOUT = 120.0

SELF_TEST_CORPUS_BYTES = 1 << 20  # proves the data path; the full 16 MB costs 0.7 s of start-up


@dataclass
class Outcome:
    ok: bool
    detail: str
    seconds: float
    trace: str = ""


def run_check(check: Check) -> Outcome:
    began = time.monotonic()
    try:
        detail = check()
    except Exception as exc:  # a self-test reports every failure and goes on
        return Outcome(False, f"{type(exc).__name__}: {exc}", time.monotonic() - began,
                       traceback.format_exc())
    return Outcome(True, detail, time.monotonic() - began)


def _child(check: Check, conn: Connection) -> None:
    conn.send(run_check(check))
    conn.close()
    # A spawned child exits through the interpreter's last full collection, which walks the
    # millions of objects torch and sympy made (1.2 s) only to free memory the OS takes back
    # anyway; frozen objects are skipped. A forked child leaves without collecting.
    gc.freeze()


class ChildCheck:
    """A check in another process; its outcome is collected once the others are done."""

    def __init__(self, check: Check) -> None:
        # fork is cheap and safe this early (no threads yet); elsewhere spawn, which the
        # frozen app supports through freeze_support in its entry point.
        context = multiprocessing.get_context("fork") if sys.platform.startswith("linux") \
            else multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe(duplex=False)
        self._process = context.Process(target=_child, args=(check, child_conn), daemon=True)
        self._began = time.monotonic()
        self._process.start()
        child_conn.close()

    def outcome(self, timeout: float) -> Outcome:
        try:
            if self._conn.poll(timeout):
                return self._conn.recv()
            self._process.kill()
            return Outcome(False, f"no answer in {timeout:.0f} s", time.monotonic() - self._began)
        except EOFError:  # it died without a word: a crash in a native library, say
            self._process.join(5)
            return Outcome(False, f"the check's process died (exit status {self._process.exitcode})",
                           time.monotonic() - self._began)
        finally:
            self._process.join(5)
            self._conn.close()


def report(name: str, outcome: Outcome) -> None:
    verdict = "ok  " if outcome.ok else "FAIL"
    print(f"{verdict}  {name:<10} {outcome.detail} [{outcome.seconds:.1f} s]", flush=True)
    if outcome.trace:
        print(outcome.trace, file=sys.stderr, flush=True)


def main(more: list[tuple[str, Check]] | None = None) -> int:
    """Run the engine's checks and ``more`` (the desktop app's, where it is installed)."""
    began = time.monotonic()
    os.environ.setdefault("COTRAIN_CORPUS_BYTES", str(SELF_TEST_CORPUS_BYTES))
    checks = [*CHECKS, *(more or [])]
    children = {name: ChildCheck(check) for name, check in checks if name in IN_CHILD}
    outcomes = {}
    for name, check in checks:
        outcomes[name] = children[name].outcome(CHILD_TIMEOUT) if name in children else run_check(check)
        report(name, outcomes[name])
    failures = sum(not o.ok for o in outcomes.values())
    verdict = "all checks passed" if not failures else f"{failures} of {len(checks)} checks failed"
    print(f"{verdict} in {time.monotonic() - began:.1f} s", flush=True)
    return 1 if failures else 0
