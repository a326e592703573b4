"""Interleaved replay: every policy sees every query, in turns, with warm-up statistics gone."""

from vlarun.bench.replay import interleaved_runs


def test_policies_take_turns_and_warmup_is_not_counted(oft_policy, frames, instruction):
    stream = [(instruction, f, None) for f in frames[:4]]
    order: list[str] = []
    policies = [oft_policy.with_setting("full"), oft_policy.with_setting("triage:0.34")]
    for p in policies:
        run = p.run_stages

        def spy(image, ins, _run=run, _name=p.hooks.tokens.name, **kw):
            order.append(_name)
            return _run(image, ins, **kw)

        p.run_stages = spy
    runs = interleaved_runs(policies, stream, warmup=2)
    assert [len(r) for r in runs] == [4, 4]
    timed = order[4:]  # 2 warm-up queries per policy came first
    assert timed == [p.hooks.tokens.name for p in policies] * 4
    assert all(len(p.stats.steps) == 4 for p in policies)  # warm-up steps were cleared
    assert policies[1].stats.steps[0].recomputed == oft_policy.model.cfg.num_visual  # fresh episode
