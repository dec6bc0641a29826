"""nanocomposer/sft_loss.py: the labelled-only LM head gives SFTTrainer's own loss, gradients and logged metrics on
packed assistant-only rows (full model and LoRA), falls back where it cannot, and runs in train_sft.main.
Micro model (vocab 512, 2 layers of 32) from tests/test_train_sft.py."""

import copy

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from transformers.loss.loss_utils import ForCausalLMLoss
from trl import SFTConfig, SFTTrainer

import train_sft
from nanocomposer import sft_loss
from nanocomposer.model_io import load_tokenizer
from nanocomposer.sft_loss import LabelledOnlyHeadSFTTrainer, sft_trainer_class, unsupported_model
from tests import test_train_sft
from tests.test_train_sft import sft_args, trajectory

micro = test_train_sft.micro  # the micro base model and SFT data (a module-scoped fixture)


@pytest.fixture
def labelled_calls(monkeypatch) -> list:
    """Grows by one each time the labelled-only path runs (so that a silent fallback cannot pass for it)."""
    calls, outputs = [], sft_loss.labelled_head_outputs
    monkeypatch.setattr(sft_loss, "labelled_head_outputs", lambda *a: calls.append(1) or outputs(*a))
    return calls


def trainer_pair(micro, tmp_path, peft=None, trainer_kwargs=None, **config):
    """(stock SFTTrainer, LabelledOnlyHeadSFTTrainer) on copies of one micro model, packed bfd as the recipe."""
    args = SFTConfig(output_dir=str(tmp_path), max_length=1024, packing=True, packing_strategy="bfd",
                     assistant_only_loss=True, per_device_train_batch_size=1, use_cpu=True, report_to="none",
                     **config)
    tokenizer = load_tokenizer(str(micro / "base"))
    dataset = Dataset.from_list([trajectory(i) for i in range(6)]).select_columns(["messages", "tools"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(micro / "base"))
    # A few steps on the first row first, so that the token accuracy and entropy compared are not those of a
    # uniform untrained head (accuracy 0). The batch comes from a trainer of a copy: SFTTrainer patches its model's
    # forward with a closure over that very model, which a deepcopy would still call.
    batch = packed_batch(SFTTrainer(model=copy.deepcopy(model), args=args, train_dataset=dataset,
                                    processing_class=tokenizer))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(15):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return tuple(cls(model=copy.deepcopy(model), args=args, train_dataset=dataset, processing_class=tokenizer,
                     peft_config=copy.deepcopy(peft), **(trainer_kwargs or {}))
                 for cls in (SFTTrainer, LabelledOnlyHeadSFTTrainer))


def packed_batch(trainer) -> dict:
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    positions = batch["position_ids"][0]
    assert "attention_mask" not in batch and (positions[1:] == 0).sum() >= 1  # several conversations in one row
    labelled = (batch["labels"] != -100).float().mean().item()
    assert 0.05 < labelled < 0.9
    return batch


def loss_grads_metrics(trainer, batch, num_items_in_batch=None):
    trainer.model.train()  # as Trainer.training_step: the metrics go to "train"
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=num_items_in_batch)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    metrics = {key: list(values) for key, values in trainer._metrics["train"].items()}
    return loss.detach(), grads, metrics


def assert_same(stock, ours):
    (loss_a, grads_a, metrics_a), (loss_b, grads_b, metrics_b) = stock, ours
    torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert metrics_a.keys() == metrics_b.keys() >= {"entropy", "mean_token_accuracy", "num_tokens"}
    for key, values in metrics_a.items():
        assert metrics_b[key] == pytest.approx(values, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("num_items_in_batch", [None, 1234])
def test_same_loss_gradients_and_metrics_as_sfttrainer(micro, tmp_path, num_items_in_batch, labelled_calls):
    stock, ours = trainer_pair(micro, tmp_path)
    batch = packed_batch(stock)
    first = loss_grads_metrics(stock, batch, num_items_in_batch)
    assert_same(first, loss_grads_metrics(ours, batch, num_items_in_batch))
    assert 0 < first[2]["mean_token_accuracy"][0] < 1 and first[2]["entropy"][0] > 0  # informative metrics
    assert first[2]["num_tokens"] == [batch["input_ids"].size(1)]
    assert_same(loss_grads_metrics(stock, batch, num_items_in_batch),  # accumulates num_tokens and the lists
                loss_grads_metrics(ours, batch, num_items_in_batch))
    assert len(labelled_calls) == 2


def test_labelled_path_really_skips_unlabelled_positions(micro, tmp_path, monkeypatch):
    _, ours = trainer_pair(micro, tmp_path)
    batch = packed_batch(ours)
    rows = []
    head = ours.model.get_output_embeddings()
    monkeypatch.setattr(head, "forward", lambda x, forward=head.forward: rows.append(x.shape[0]) or forward(x))
    ours.compute_loss(ours.model, dict(batch))
    assert rows == [(batch["labels"][:, 1:] != -100).sum().item()]


def test_same_in_eval_and_with_dft(micro, tmp_path, labelled_calls):
    stock, ours = trainer_pair(micro, tmp_path, loss_type="dft")
    batch = packed_batch(stock)
    assert_same(loss_grads_metrics(stock, batch), loss_grads_metrics(ours, batch))
    for trainer in (stock, ours):
        trainer.model.eval()
    with torch.no_grad():
        losses = [trainer.compute_loss(trainer.model, dict(batch)) for trainer in (stock, ours)]
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
    assert ours._metrics["eval"]["mean_token_accuracy"] == pytest.approx(stock._metrics["eval"]["mean_token_accuracy"])
    assert ours._metrics["eval"]["entropy"] == pytest.approx(stock._metrics["eval"]["entropy"], rel=1e-5)
    assert len(labelled_calls) == 2


def test_same_with_lora(micro, tmp_path, labelled_calls):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM",
                      init_lora_weights=False)  # nonzero B: the adapters change the loss and get every gradient
    stock, ours = trainer_pair(micro, tmp_path, peft=lora)
    assert ours.labelled_only_fallback is None
    batch = packed_batch(stock)
    stock_result = loss_grads_metrics(stock, batch)
    assert all("lora_" in name for name in stock_result[1])
    assert_same(stock_result, loss_grads_metrics(ours, batch))
    assert len(labelled_calls) == 1


def test_falls_back_to_sfttrainer_where_it_cannot_reproduce_it(micro, tmp_path, capsys, labelled_calls):
    def causal_lm_loss(outputs, labels, num_items_in_batch=None):  # a custom loss: the labelled path cannot know it
        return ForCausalLMLoss(outputs.logits, labels, outputs.logits.size(-1), num_items_in_batch)

    stock, ours = trainer_pair(micro, tmp_path, trainer_kwargs={"compute_loss_func": causal_lm_loss})
    assert ours.labelled_only_fallback == "a custom compute_loss_func"
    assert "using SFTTrainer's own loss (a custom compute_loss_func)" in capsys.readouterr().out
    batch = packed_batch(stock)
    assert_same(loss_grads_metrics(stock, batch), loss_grads_metrics(ours, batch))

    _, plain = trainer_pair(micro, tmp_path)
    loss, outputs = plain.compute_loss(plain.model, dict(batch), return_outputs=True)  # eval's logits: stock path
    assert outputs.logits.shape[:2] == batch["input_ids"].shape
    assert not labelled_calls
    torch.testing.assert_close(loss, plain.compute_loss(plain.model, dict(batch)), atol=1e-5, rtol=1e-5)
    assert len(labelled_calls) == 1

    softcapped = copy.deepcopy(stock.model)
    softcapped.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in unsupported_model(softcapped)
    assert unsupported_model(stock.model) is None


def test_default_is_on_for_cpu_only(tmp_path, monkeypatch):
    cpu = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert sft_trainer_class(None, cpu) is LabelledOnlyHeadSFTTrainer
    assert sft_trainer_class(False, cpu) is SFTTrainer
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = copy.copy(cpu)
    gpu.use_cpu = False
    assert sft_trainer_class(None, gpu) is SFTTrainer
    assert sft_trainer_class(True, gpu) is LabelledOnlyHeadSFTTrainer


def test_train_sft_runs_with_it_and_logs_the_metrics(micro, tmp_path, monkeypatch, labelled_calls):
    logged = []
    monkeypatch.setattr(SFTTrainer, "log", lambda self, logs, *a, log=SFTTrainer.log: (log(self, logs, *a),
                                                                                     logged.append(dict(logs))))
    metrics = train_sft.main(*sft_args(micro, tmp_path, "--max_steps", "2", "--labelled_only_head", "true",
                                       "--eval_on_start", "false"))
    assert metrics["global_step"] == 2 and torch.isfinite(torch.tensor(metrics["train_loss"]))
    assert len(labelled_calls) >= 3  # two training steps and the final evaluation
    train_logs = [log for log in logged if "loss" in log]
    assert len(train_logs) == 2
    for log in train_logs:
        assert 0 <= log["mean_token_accuracy"] <= 1 and log["entropy"] > 0 and log["num_tokens"] > 0
    assert metrics["final_eval_token_accuracy"] is not None
