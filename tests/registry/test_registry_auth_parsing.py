"""``WWW-Authenticate`` challenges and the token cache, as registries send them. Pure."""

from __future__ import annotations

from drivers.registry.auth import Credentials, TokenCache, parse_challenge, request_scope


def test_bearer_challenge_with_quoted_commas_is_parsed() -> None:
    c = parse_challenge('Bearer realm="https://auth.example.com/token",service="registry",'
                        'scope="repository:team/app:pull,push",error="insufficient_scope"')
    assert c is not None
    assert c.scheme == "bearer"
    assert c.realm == "https://auth.example.com/token"
    assert c.params["service"] == "registry"
    assert c.scope == "repository:team/app:pull,push"
    assert c.insufficient_scope


def test_basic_challenge_and_garbage() -> None:
    basic = parse_challenge('Basic realm="Registry Realm"')
    assert basic is not None
    assert (basic.scheme, basic.realm) == ("basic", "Registry Realm")
    assert parse_challenge("") is None


def test_tokens_expire_before_the_registry_says() -> None:
    cache = TokenCache()
    cache.put("r", "s", "tok", expires_in=60, now=100.0)
    assert cache.get("r", "s", now=149.0) == "tok"
    assert cache.get("r", "s", now=151.0) is None  # 10 s margin
    assert cache.get("r", "other", now=100.0) is None


def test_credentials_never_show_the_password() -> None:
    creds = Credentials("alice", "s3cret")
    assert "s3cret" not in repr(creds)
    assert creds.basic == "Basic YWxpY2U6czNjcmV0"
    assert Credentials().basic is None
    assert request_scope("team/app", push=True) == "repository:team/app:pull,push"


def test_a_challenge_scope_is_canonical_whatever_order_the_registry_lists_actions() -> None:
    """Distribution lists actions in Go map order; our token requests must not vary."""
    from drivers.registry.auth import canonical_scope

    assert canonical_scope("repository:team/app:push,pull") == "repository:team/app:pull,push"
    assert canonical_scope("repository:a:pull repository:b:push,delete,pull") == (
        "repository:a:pull repository:b:delete,pull,push")
    assert canonical_scope("") == ""
