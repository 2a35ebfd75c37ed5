"""Outside the coverage, a family is refused with exit 2 and one line naming it and what could not be
mapped; a partially mapped family lists its absent sites with reasons, and asking for one is exit 2.
Nothing silently reads a neighbouring module."""

from __future__ import annotations

import json

from app.commands.cli import main


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_family_whose_layers_are_no_residual_stream_is_refused(tmp_path, capsys):
    # XLM keeps its attention and feed-forward layers in separate lists: no block list chains
    assert main(["inspect", "tiny:xlm"]) == 2
    err = _err(capsys)
    assert "xlm" in err and "resid_pre / resid_post cannot be mapped" in err and "not supported" in err
    assert main(["capture", "tiny:xlm", "--corpus", "lee", "--max-tokens", "64", "--out", str(tmp_path / "s"),
                 "--quiet"]) == 2
    assert "resid_pre / resid_post cannot be mapped" in _err(capsys)
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_several_residual_streams_per_token_are_refused(capsys):
    # DeepSeek V4's hyper-connections pass (batch, seq, streams, d) between blocks: no one resid_post
    assert main(["inspect", "tiny:deepseek_v4"]) == 2
    err = _err(capsys)
    assert "deepseek_v4" in err and "several residual streams" in err


def test_a_family_without_a_buildable_config_is_named(capsys):
    assert main(["inspect", "tiny:no_such_family"]) == 2
    assert "no_such_family" in _err(capsys)


def test_a_parallel_block_lists_resid_mid_as_absent_and_refuses_it(tmp_path, capsys):
    assert main(["inspect", "tiny:gpt_neox", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["block"] == "parallel" and "resid_mid" not in card["sites"]
    assert "parallel" in card["absent"]["resid_mid"]
    assert main(["capture", "tiny:gpt_neox", "--corpus", "lee", "--max-tokens", "64", "--sites",
                 "resid_post,resid_mid", "--out", str(tmp_path / "s"), "--quiet"]) == 2
    err = _err(capsys)
    assert "resid_mid" in err and "parallel" in err and "available:" in err


def test_a_state_space_model_has_only_the_residual_sites(capsys):
    assert main(["inspect", "tiny:mamba", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["block"] == "recurrent"
    assert set(card["sites"]) == {"embed", "resid_pre", "resid_post", "final_norm"}
    for site in ("attn_out", "mlp_out", "resid_mid"):
        assert "state-space" in card["absent"][site]
    assert main(["capture", "tiny:mamba", "--corpus", "lee", "--max-tokens", "64", "--sites", "attn_out",
                 "--out", "/nonexistent/never-written", "--quiet"]) == 2
    assert "attn_out" in _err(capsys)


def test_a_family_that_pools_the_sequence_between_blocks_is_refused_by_name(tmp_path, capsys):
    # Funnel halves the sequence between its blocks: the probe sees a block receive fewer positions than
    # the input has tokens, and the family is refused (it once crashed mid-capture with "missing rows")
    assert main(["capture", "tiny:funnel", "--corpus", "lee", "--max-tokens", "64", "--out", str(tmp_path / "s"),
                 "--quiet"]) == 2
    err = _err(capsys)
    assert "funnel" in err and "pools or reorders the sequence" in err and "4 positions for the 8" in err
    assert not (tmp_path / "s" / "manifest.json").exists()
