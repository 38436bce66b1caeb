"""The image-classification family: WebDataset shards read as untrusted input, seeded
augmentations, reproducible batches and cuts, and the architectures it will (not) build."""

import importlib
import io
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest
import torch
from PIL import Image

from engine.authoring.image_shards import cut_images
from engine.authoring.manifest import HELDOUT, SHARDS, file_entry, update_manifest, write_project
from engine.project import DataSpec, FileRef
from engine.shards.files import FolderFiles
from engine.shards.webdataset import MAX_MEMBER_BYTES
from engine.tasks import TaskData, create_task
from engine.tasks.hf_models import ModelError
from engine.tasks.image_shards import count_images, read_image_shard
from engine.tasks.images import TORCHVISION_MODELS, TORCHVISION_OPTIONS, augment
from engine.tasks.text_shards import ShardError

TINY_RESNET = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic"}


def picture(size=(12, 10), mode="RGB", fmt="PNG", seed=0) -> bytes:
    rng = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], len(mode)), generator=rng)
    image = Image.frombytes(mode, size, bytes(pixels.to(torch.uint8).flatten().tolist()))
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def params(**changes):
    return {"architecture": "resnet", "config": dict(TINY_RESNET), "num_classes": 3, "image_size": 16,
            "micro_batch": 4, "per_visit": 2, **changes}


# -- shards --------------------------------------------------------------------------------


def test_a_shard_reads_as_images_and_labels_in_its_order(tmp_path):
    shard = write_tar(tmp_path / "s.tar", [
        ("b.png", picture(seed=1)), ("b.cls", b"2\n"), ("b.json", b"{}"),
        ("sub/a.jpg", picture(fmt="JPEG", seed=2)), ("sub/a.cls", b"0"),
        ("c.cls", b"1"), ("c.png", picture(size=(40, 40), mode="L")),
    ])
    colour = read_image_shard(shard, 3, 16, 3)
    assert colour.images.shape == (3, 3, 16, 16) and colour.images.dtype == torch.uint8
    assert colour.labels.tolist() == [2, 0, 1]
    grey = read_image_shard(shard, 3, 16, 1)
    assert grey.images.shape == (3, 1, 16, 16)


@pytest.mark.parametrize(("members", "says"), [
    ([("a.png", picture()), ("a.cls", b"3")], "'a.cls' says class 3; the project has classes 0 to 2"),
    ([("a.png", picture()), ("a.cls", b"one")], "'a.cls' is not a class index"),
    ([("a.png", b"GIF89a not a png"), ("a.cls", b"1")], "'a.png' is not a PNG image"),
    ([("a.jpg", picture(fmt="PNG")), ("a.cls", b"1")], "'a.jpg' is not a JPEG image"),
    ([("a.png", picture(size=(4097, 1), mode="L")), ("a.cls", b"1")], "'a.png' is 4097x1 pixels"),
    ([("a.png", picture())], "the image 'a' has no a.cls label"),
    ([("a.cls", b"1")], "the label a.cls has no image"),
    ([("a.png", picture()), ("a.png", picture()), ("a.cls", b"1")], "'a' is in the shard twice"),
    ([("x.json", b"{}")], "holds no images"),
])
def test_a_bad_shard_says_which_member_is_wrong(tmp_path, members, says):
    with pytest.raises(ShardError, match=says.replace(".", r"\.").replace("(", r"\(")):
        read_image_shard(write_tar(tmp_path / "bad.tar", members), 3, 16, 3)


def test_an_oversized_member_is_refused_before_it_is_read(tmp_path):
    # Only the header: a shard that claims a 40 MB member is refused without reading 40 MB.
    info = tarfile.TarInfo("huge.png")
    info.size = 40 * 2**20
    (tmp_path / "huge.tar").write_bytes(info.tobuf(tarfile.USTAR_FORMAT))
    with pytest.raises(ShardError, match=f"'huge.png' has {40 * 2**20} bytes; at most {MAX_MEMBER_BYTES}"):
        read_image_shard(tmp_path / "huge.tar", 3, 16, 3)


def test_links_and_compressed_tars_are_refused(tmp_path):
    link = tarfile.TarInfo("a.png")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with tarfile.open(tmp_path / "link.tar", "w") as tar:
        tar.addfile(link)
    with pytest.raises(ShardError, match=r"'a\.png' is not a regular file"):
        read_image_shard(tmp_path / "link.tar", 3, 16, 3)
    with tarfile.open(tmp_path / "gz.tar", "w:gz") as tar:
        tar.add(write_tar(tmp_path / "inner.tar", [("a.png", picture()), ("a.cls", b"1")]), "x")
    with pytest.raises(ShardError, match="not an uncompressed tar"):
        read_image_shard(tmp_path / "gz.tar", 3, 16, 3)


# -- a project's data ----------------------------------------------------------------------


@pytest.fixture
def project(tmp_path) -> tuple[Path, DataSpec]:
    """Three classes of 8 noise images, cut into small shards and a held-out set."""
    images = tmp_path / "images"
    for label, name in enumerate(["cat", "dog", "eel"]):
        (images / name).mkdir(parents=True)
        for number in range(8):
            (images / name / f"{number}.png").write_bytes(picture(seed=10 * label + number))
    root = tmp_path / "project"
    count, held, names, side = cut_images(images, root, 12_000, 4)
    assert (count, held, names, side) == (24, 6, ["cat", "dog", "eel"], 10)  # (12x10 pictures)
    spec = DataSpec(shards=[FileRef(**file_entry(root, p)) for p in sorted((root / SHARDS).iterdir())],
                    heldout=[FileRef(**file_entry(root, p)) for p in sorted((root / HELDOUT).iterdir())])
    return root, spec


def test_cutting_the_same_folder_again_gives_the_same_files(project, tmp_path):
    _, spec = project
    assert len(spec.shards) > 1
    cut_images(tmp_path / "images", tmp_path / "again", 12_000, 4)
    again = sorted(file_entry(tmp_path / "again", p)["sha256"] for p in (tmp_path / "again").rglob("*.tar"))
    assert again == sorted(ref.sha256 for ref in [*spec.shards, *spec.heldout])


def test_the_author_chooses_how_many_images_are_held_out(project, tmp_path):
    count, held, _, _ = cut_images(tmp_path / "images", tmp_path / "chosen", 12_000, 4, heldout_size=10)
    assert (count, held) == (24, 10)
    labels = []
    for path in sorted((tmp_path / "chosen" / HELDOUT).iterdir()):
        with tarfile.open(path) as tar:
            labels += [name for name in tar.getnames() if name.endswith(".cls")]
    assert len(labels) == 10
    with pytest.raises(ValueError, match="would leave none of the 24 images"):
        cut_images(tmp_path / "images", tmp_path / "all", 12_000, 4, heldout_size=24)


def test_batches_are_the_same_wherever_they_are_drawn(project):
    root, spec = project
    first = create_task("image-classification", params(augmentations=["random_crop", "rotate"]),
                        TaskData(spec, FolderFiles(root)))
    second = create_task("image-classification", params(augmentations=["rotate", "random_crop"]),
                         TaskData(spec, FolderFiles(root)))
    for seed, index in [(0, 0), (0, 5), (7, 3)]:
        a, b = first.batch(seed, index), second.batch(seed, index)
        assert a.tensors["pixel_values"].shape == (4, 3, 16, 16)
        assert torch.equal(a.tensors["pixel_values"], b.tensors["pixel_values"])
        assert torch.equal(a.tensors["labels"], b.tensors["labels"])
    other_seed = first.batch(1, 0).tensors["pixel_values"]
    assert not torch.equal(first.batch(0, 0).tensors["pixel_values"], other_seed)


def test_the_heldout_set_is_every_heldout_image_once_unaugmented(project):
    root, spec = project
    task = create_task("image-classification", params(augmentations=["horizontal_flip"], mean=[0.5] * 3,
                                                      std=[0.25] * 3), TaskData(spec, FolderFiles(root)))
    batches = list(task.heldout())
    assert sum(b.size for b in batches) == 6
    again = list(task.heldout())
    assert all(torch.equal(x.tensors["pixel_values"], y.tensors["pixel_values"])
               for x, y in zip(batches, again, strict=True))
    pixels = torch.cat([b.tensors["pixel_values"] for b in batches])
    assert pixels.min() >= -2 and pixels.max() <= 2  # (x - 0.5) / 0.25 of x in [0, 1]


def test_metrics_are_sums_over_the_batch(project):
    root, spec = project
    task = create_task("image-classification", params(), TaskData(spec, FolderFiles(root)))
    model = task.build_model().eval()
    batch = task.batch(0, 0)
    found = task.metrics(model, batch)
    with torch.no_grad():
        mean = task.loss(model, batch).item()
    assert found["loss"] == pytest.approx(mean * batch.size, rel=1e-5)
    assert found["accuracy"] in {0.0, 1.0, 2.0, 3.0, 4.0}
    assert task.memory_needed() > 4 * sum(p.numel() for p in model.parameters())


# -- augmentations -------------------------------------------------------------------------


@pytest.mark.parametrize("names", [["random_crop"], ["horizontal_flip"], ["rotate"],
                                   ["random_crop", "horizontal_flip", "rotate"]])
def test_augmentations_are_drawn_from_the_batch_identity(names):
    pixels = torch.rand(16, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    once = augment(pixels, names, seed=3, index=7)
    assert once.shape == pixels.shape
    assert not torch.equal(once, pixels)
    assert torch.equal(once, augment(pixels, names, seed=3, index=7))
    assert not torch.equal(once, augment(pixels, names, seed=3, index=8))
    assert not torch.equal(once, augment(pixels, names, seed=4, index=7))


# -- architectures -------------------------------------------------------------------------


def test_torchvision_that_does_not_load_says_how_to_fix_it(monkeypatch):
    real = importlib.import_module

    def broken(name, *args):
        if name.startswith("torchvision"):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *args)

    monkeypatch.setattr("engine.tasks.images.importlib.import_module", broken)
    with pytest.raises(ModelError) as failed:
        create_task("image-classification", {"architecture": "torchvision:resnet18", "num_classes": 10})
    message = str(failed.value)
    assert "torchvision:resnet18 needs torchvision, which does not load beside this torch" in message
    assert "operator torchvision::nms does not exist" in message
    assert "pip install 'torchvision==0." in message and "'resnet'" in message


@pytest.mark.parametrize("name", sorted(TORCHVISION_MODELS))
def test_every_allowed_torchvision_network_trains_on_grey_images_and_downloads_nothing(
        project, monkeypatch, tmp_path, name):
    pytest.importorskip("torchvision.models", reason="torchvision does not load beside this torch: "
                        "tests/collab/test_torchvision.py runs this in a venv that has it")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))  # where weights would be downloaded
    root, spec = project
    task = create_task("image-classification",
                       params(architecture=f"torchvision:{name}", channels=1, image_size=32,
                              config={option: 0.0 for option in TORCHVISION_OPTIONS.get(name, ())}),
                       TaskData(spec, FolderFiles(root)))
    model = task.build_model()
    assert task.parameters() == sum(p.numel() for p in model.parameters())  # (counted on the meta device)
    assert task.memory_needed() > 4 * task.parameters()
    batch = task.batch(0, 0)
    loss = task.loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert 0 <= task.metrics(model, batch)["accuracy"] <= 4
    assert not (tmp_path / "torch-home").exists()


@pytest.mark.parametrize(("architecture", "config", "says"), [
    ("torchvision:vgg16", {}, "not a torchvision architecture this Cotrain builds"),
    ("torchvision:resnet18", {"weights": "IMAGENET1K_V1"}, "takes no config"),
    ("torchvision:convnext_tiny", {"layer_scale": 0.1}, "takes only stochastic_depth_prob"),
    ("torchvision:mobilenet_v3_small", {"dropout": 1.5}, r"a probability in \[0, 1\), not 1.5"),
    ("bert", {}, "model type 'bert' is not one this Cotrain builds"),
    ("timm_wrapper", {}, "model type 'timm_wrapper' is not one this Cotrain builds"),
    ("resnet", {"trust_remote_code": True}, "a project sends data, never code"),
    ("resnet", {"auto_map": "x.Model"}, "a project sends data, never code"),
    ("resnet", {"num_labels": 5}, "config.num_labels is 5 but the project's num_classes is 3"),
])
def test_architectures_outside_the_allow_list_are_refused(architecture, config, says):
    with pytest.raises(ModelError, match=says):
        create_task("image-classification", params(architecture=architecture, config=config))


def test_the_model_takes_the_projects_channels_and_classes():
    task = create_task("image-classification", params(channels=1, mean=[0.5], std=[0.5]))
    model = task.build_model()
    logits = model(pixel_values=torch.zeros(2, 1, 16, 16)).logits
    assert logits.shape == (2, 3)
    with pytest.raises(ModelError, match="mean has 3 values; the images have 1 channels"):
        create_task("image-classification", params(channels=1, mean=[0.5] * 3))


def test_a_torchvision_network_trains_on_grey_images(project, monkeypatch):
    """torchvision does not load beside every torch: a stand-in with its builders' signature
    checks what Cotrain does with one (RGB input, a tensor of logits out, no weights asked for)."""
    asked = {}

    def resnet18(weights, num_classes):
        asked.update(weights=weights, num_classes=num_classes)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                   torch.nn.LazyLinear(num_classes))

    models = types.ModuleType("torchvision.models")
    models.resnet18 = resnet18  # type: ignore[attr-defined]
    real = importlib.import_module
    monkeypatch.setattr("engine.tasks.images.importlib.import_module",
                        lambda name, *args: models if name == "torchvision.models" else real(name, *args))
    root, spec = project
    task = create_task("image-classification",
                       params(architecture="torchvision:resnet18", config={}, channels=1),
                       TaskData(spec, FolderFiles(root)))
    model = task.build_model()
    batch = task.batch(0, 0)
    assert batch.tensors["pixel_values"].shape == (4, 1, 16, 16)
    task.loss(model, batch).backward()
    assert asked == {"weights": None, "num_classes": 3}
    assert 0 <= task.metrics(model, batch)["accuracy"] <= 4


DECODE_PEAK = """
import sys
from pathlib import Path
import torch
from engine.tasks.image_shards import count_images, read_image_shard

def hwm():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
before = rss()
with open("/proc/self/clear_refs", "w") as reset:  # (the peak so far: the imports)
    reset.write("5")
examples = read_image_shard(Path(sys.argv[1]), 3, int(sys.argv[2]), 3)
print(hwm() - before, examples.images.numel())
"""


def test_a_shards_images_decode_into_memory_once(tmp_path):
    """Issue 50: 200 flat 1024x1024 PNGs in a 1.4 MiB tar raised peak RSS by 1.2 GiB: each
    image decoded into a tensor of its own, then all stacked into one, twice the pixels."""
    flat = io.BytesIO()
    Image.new("RGB", (512, 512), (90, 120, 200)).save(flat, format="PNG")
    members = [(f"{n}.{kind}", data) for n in range(80) for kind, data in (("png", flat.getvalue()),
                                                                             ("cls", b"1"))]
    shard = write_tar(tmp_path / "flat.tar", members)
    done = subprocess.run([sys.executable, "-c", DECODE_PEAK, str(shard), "512"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    peak, pixels = map(int, done.stdout.split())
    assert pixels == 80 * 3 * 512 * 512
    assert peak < 1.4 * pixels, f"decoding {pixels / 2**20:.0f} MB of pixels took {peak / 2**20:.0f} MB"


def test_a_shard_holding_more_images_than_its_manifest_says_is_refused(tmp_path):
    """Peers size their memory by the manifest's image counts: a shard past its count would
    decode into memory nobody set aside."""
    shard = write_tar(tmp_path / "s.tar", [(f"{k}.{suffix}", picture() if suffix == "png" else b"1")
                                           for k in "abc" for suffix in ("png", "cls")])
    assert count_images(shard) == 3
    assert len(read_image_shard(shard, 3, 16, 3, declared=3)) == 3
    with pytest.raises(ShardError, match=r"s\.tar holds 3 images; the project's manifest says 2"):
        read_image_shard(shard, 3, 16, 3, declared=2)


def test_an_image_projects_manifest_counts_each_shards_images(project):
    root, _ = project
    write_project(root, {"id": "pets", "task": "image-classification"})
    data = update_manifest(root)
    counted = {entry["path"]: entry["examples"] for entry in [*data["shards"], *data["heldout"]]}
    assert sum(counted.values()) == 24
    for path, examples in counted.items():
        assert len(read_image_shard(root / path, 3, 16, 3)) == examples
