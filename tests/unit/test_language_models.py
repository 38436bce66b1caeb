"""The text families on the catalog's albert-mini: the batches a peer draws, the masking,
sentence order, and what a broken project is told."""

import json

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cli import build_parser, limits_from_args
from engine.governor.limits import Limits
from engine.peer.project_data import ProjectRefused, check_fits
from engine.peer.runner import built
from engine.project_folders import load_project_folder
from engine.shards.files import FolderFiles
from engine.tasks import TaskData, create_task, initial_model
from engine.tasks.hf_models import ModelError, training_memory
from engine.tasks.masking import IGNORE, mask_tokens
from tests.projects import albert_folder


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
    return albert_folder(tmp_path_factory.mktemp("projects"))


def task_of(folder, params=None, task=None):
    spec = folder.spec
    return create_task(task or spec.task, params or dict(spec.task_params),
                       TaskData(spec.data, FolderFiles(folder.root)))


def test_a_micro_batch_is_the_same_whoever_draws_it_and_peers_draw_different_ones(albert):
    task = task_of(albert)
    first, again = task.batch(7, 3), task_of(albert).batch(7, 3)
    assert all(torch.equal(first.tensors[k], again.tensors[k]) for k in first.tensors)
    other = task.batch(8, 3)
    assert not torch.equal(first.tensors["input_ids"], other.tensors["input_ids"])
    assert first.size == albert.spec.task_params["micro_batch"]


def test_sentence_order_pairs_come_both_ways_and_albert_learns_both_heads(albert):
    task = task_of(albert)
    labels = torch.cat([task.batch(1, i).tensors["sentence_order_label"] for i in range(8)])
    assert 0.2 < labels.float().mean() < 0.8
    model = initial_model(task, 1)
    assert type(model).__name__ == "AlbertForPreTraining"
    loss = task.loss(model, task.batch(1, 0))
    loss.backward()
    assert model.sop_classifier.classifier.weight.grad.abs().sum() > 0  # the sentence-order head learns


def test_whole_word_masking_masks_every_piece_of_a_chosen_word():
    ids = torch.arange(100, 120).reshape(2, 10)
    words = torch.tensor([[-1, 0, 0, 0, 1, 2, 2, 3, 3, -1], [-1, 0, 1, 1, 1, 2, 3, 4, 4, -1]])
    for trial in range(20):
        _, labels = mask_tokens(ids, words, 0.5, True, mask_id=4, vocab_size=200,
                                generator=torch.Generator().manual_seed(trial))
        chosen = labels != IGNORE
        assert not chosen[words < 0].any()  # [CLS] and [SEP] are never chosen
        for row in range(2):
            for word in words[row].unique().tolist():
                if word >= 0:
                    picked = chosen[row][words[row] == word]
                    assert picked.all() or not picked.any()  # a word is chosen whole or not at all
        assert torch.equal(labels[chosen], ids[chosen])


def test_the_held_out_set_is_scored_the_same_way_every_time(albert):
    task = task_of(albert)
    model = initial_model(task, 1).eval()
    with torch.no_grad():
        scores = [sum(task.metrics(model, b)["loss"] for b in task_of(albert).heldout()) for _ in range(2)]
    assert scores[0] == scores[1] > 0


def bad(albert, tmp_path, **changes):
    project = json.loads((albert.root / "project.json").read_text())
    project["task_params"].update(changes)
    return project


@pytest.mark.parametrize(("changes", "message"), [
    ({"model_type": "not-a-model"}, "model type 'not-a-model' is not one this Cotrain builds"),
    ({"config": {"trust_remote_code": True, "vocab_size": 8000}},
     "asks for trust_remote_code: a project sends data"),
    ({"config": {"auto_map": "evil.Model"}}, "asks for auto_map"),
    ({"config": {"auto_map": {"AutoModel": "evil.Model"}}}, r"got `object` - at `\$.config\[...\]`"),
    ({"seq_len": 4096}, "seq_len is 4096 but the model has 128 positions"),
    ({"surprise": 1}, "unknown field `surprise`"),
    ({"config": {"vocab_size": 8000, "num_hiden_layers": 2}},
     "no setting 'num_hiden_layers' \\(did you mean 'num_hidden_layers'\\?\\): transformers would ignore it"),
    ({"config": {"vocab_size": 8000, "attn_implementation": "kernels-community/flash-attn"}},
     "attn_implementation 'kernels-community/flash-attn': .* never code from a model hub"),
])
def test_a_project_asking_for_what_cotrain_does_not_build_gets_a_clear_error(albert, changes, message):
    params = {**albert.spec.task_params, **changes}
    with pytest.raises(ValueError, match=message):
        task_of(albert, params)


@pytest.mark.parametrize(("config", "message"), [
    ({"hidden_act": 5}, "cannot configure a 'albert' model from the project: .*hidden_act"),
    ({"layer_norm_eps": "small"}, "cannot configure a 'albert' model from the project: .*layer_norm_eps"),
    ({"num_attention_heads": 0}, "cannot build this 'albert' model: ZeroDivisionError"),
    ({"embedding_size": -3}, "cannot build this 'albert' model: RuntimeError"),
    ({"hidden_size": -3}, "the model's hidden_size is -3: it must be at least 1"),
    ({"num_hidden_layers": -3}, "the model's num_hidden_layers is -3: it must be from 1 to 1,000"),
    ({"num_hidden_layers": 2**40}, "num_hidden_layers is 1099511627776: it must be from 1 to 1,000"),
    ({"num_hidden_groups": 100_000}, "this 'albert' model's configuration builds more than 5,000 modules"),
])
def test_a_configuration_transformers_rejects_in_its_own_way_gets_a_clear_error(albert, config, message):
    """However the model's own code objects to a project's values, the peer says so and
    goes on running: a ModelError, never the library's exception out of the peer."""
    params = json.loads(json.dumps(albert.spec.task_params))
    params["config"].update(config)
    with pytest.raises(ModelError, match=message):
        task_of(albert, params).memory_needed()


ALBERT_KEYS = ["vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
               "layer_norm_eps", "classifier_dropout_prob", "num_hidden_groups", "pad_token_id"]
VALUES = st.one_of(st.integers(-2**40, 2**40), st.floats(allow_nan=True), st.booleans(), st.text(max_size=8),
                   st.lists(st.integers(-4, 64), max_size=3))


@settings(max_examples=100, derandomize=True, deadline=None)
@given(config=st.dictionaries(st.sampled_from(ALBERT_KEYS), VALUES, max_size=3))
def test_any_values_in_a_configuration_give_a_model_or_a_clear_error(albert, config):
    params = json.loads(json.dumps(albert.spec.task_params))
    params["config"].update(config)
    try:
        needed = task_of(albert, params).memory_needed()
    except ModelError as exc:  # (it names the value it refuses, or says that the model's code did)
        assert any(key in str(exc) for key in config) or "this 'albert' model" in str(exc), exc
    else:  # (a model that builds needs memory, so that the memory limit means something)
        assert needed > training_memory(1)


def test_a_model_that_builds_but_breaks_on_its_first_batch_is_refused_with_what_broke(albert):
    params = json.loads(json.dumps(albert.spec.task_params))
    params["config"]["type_vocab_size"] = 0  # (every token's type 0 is out of range)
    spec = msgspec.structs.replace(albert.spec, task_params=params)
    with pytest.raises(ModelError, match="fails on a batch of its own data: RuntimeError: index_select"):
        built(task_of(albert, params), spec, seed=1)


def test_a_tokenizer_smaller_than_the_models_vocabulary_is_refused(albert):
    params = json.loads(json.dumps(albert.spec.task_params))
    params["config"]["vocab_size"] = 30000
    with pytest.raises(ModelError, match="the tokenizer has 8000 tokens, the model's vocabulary 30000"):
        task_of(albert, params).batch(0, 0)
    params["config"]["vocab_size"] = 4000
    with pytest.raises(ModelError, match="vocabulary only 4000"):
        task_of(albert, params).batch(0, 0)


def test_a_model_over_the_memory_limit_is_refused_before_a_byte_is_downloaded(albert, tmp_path):
    params = json.loads(json.dumps(albert.spec.task_params))
    params["config"].update(hidden_size=2048, intermediate_size=8192, num_attention_heads=16)
    spec = albert.spec
    task = create_task(spec.task, params, TaskData(spec.data, FolderFiles(tmp_path / "nothing-here")))
    with pytest.raises(ProjectRefused, match=r"needs about [\d,]+ MB of memory .* lets Cotrain use 512 MB"):
        check_fits(spec, task, Limits(max_memory_mb=512))


def test_a_shard_larger_than_the_disk_limit_set_on_the_command_line_is_refused(albert, tmp_path):
    args = build_parser().parse_args(["peer", "--project", "albert-mini", "--max-disk", "0.5"])
    limits = limits_from_args(args)
    assert limits.max_disk_gb == 0.5
    data = albert.spec.data
    big = msgspec.structs.replace(data.shards[0], bytes=800 * 2**20)
    spec = msgspec.structs.replace(albert.spec, data=msgspec.structs.replace(data, shards=[big]))
    task = create_task(spec.task, spec.task_params, TaskData(spec.data, FolderFiles(tmp_path / "nothing")))
    with pytest.raises(ProjectRefused, match=r"has files of 0\.8 GB; the disk limit is 0\.5 GB.*--max-disk"):
        check_fits(spec, task, limits)
    check_fits(albert.spec, task, limits)  # (its real shards fit)


def test_a_malformed_project_file_names_the_field(albert, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    project = json.loads((albert.root / "project.json").read_text())
    project["target_batch_size"] = "many"
    (folder / "project.json").write_text(json.dumps(project))
    with pytest.raises(ValueError, match=r"Expected `int`, got `str` - at `\$.target_batch_size`"):
        load_project_folder(folder)
    (folder / "project.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_project_folder(folder)
