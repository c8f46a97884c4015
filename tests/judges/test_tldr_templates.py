"""The TL;DR judge prompts are the ones their papers used, under their own names."""

from lit_rlhf.judges.templates import get_template


def test_default_tldr_prompt_is_the_n_plus_appendix_i_prompt():
    tldr = get_template("tldr")
    text = tldr.render("SUBREDDIT: r/x\n\nTITLE: t\n\nPOST: p\n\nTL;DR:", " one", " two")
    assert "Judge based on accuracy, coverage, and coherence." in text
    assert "### Post:\nSUBREDDIT: r/x" in text and "### Summary A:\n one" in text and "### Summary B:\n two" in text
    assert text.endswith('Preferred: <"A" or "B">')
    assert tldr.parse("Comparison: B is better.\nPreferred: B") == "second"


def test_the_dpo_papers_prompt_keeps_its_own_name():
    dpo = get_template("tldr_dpo")
    text = dpo.render("post", "a", "b")
    assert "A good summary is both precise and concise." in text and "coherence" not in text
    assert dpo.parse("Preferred: A") == "first"
