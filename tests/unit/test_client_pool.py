"""The SDK client pool: runs spread over a few clients, each run always on the same one."""

from __future__ import annotations

from agentrun.model.anthropic_calling import ClientPool


async def test_runs_are_spread_over_shards_and_a_run_keeps_its_client() -> None:
    pool = ClientPool(shards=4, max_connections=400)
    try:
        clients = {
            uid: pool.model(api_key="sk-ant-pool", base_url="http://127.0.0.1:9", shard_key=uid).client
            for uid in (f"uid-{i}" for i in range(64))
        }
        assert len({id(c) for c in clients.values()}) == 4
        again = pool.model(api_key="sk-ant-pool", base_url="http://127.0.0.1:9", shard_key="uid-7").client
        assert again is clients["uid-7"]
        other_key = pool.model(api_key="sk-ant-other", base_url="http://127.0.0.1:9", shard_key="uid-7")
        assert other_key.client is not clients["uid-7"]
    finally:
        await pool.close()


async def test_every_client_shares_one_tls_context_so_the_ca_bundle_is_loaded_once() -> None:
    pool = ClientPool(shards=4)
    try:
        clients = {
            pool.model(api_key=key, base_url="https://127.0.0.1:9", shard_key=f"uid-{i}").client
            for key in ("sk-ant-a", "sk-ant-b")
            for i in range(32)
        }
        assert len(clients) == 8
        contexts = {id(c._client._transport._pool._ssl_context) for c in clients}  # type: ignore[attr-defined]
        assert len(contexts) == 1
    finally:
        await pool.close()
