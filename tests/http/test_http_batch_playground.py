"""``/v1/files`` + ``/v1/batches`` with the openai SDK, and ``/playground`` in headless chromium,
against the session's shared ``tokenmold serve`` (embedded SmolLM2-135M on vLLM CPU) with an API key."""

from __future__ import annotations

import io
import json
import shutil
import subprocess

import httpx
import openai
import pytest
from support.live_api import KEY, MODEL, finished_batch
from support.paths import ROOT

pytestmark = pytest.mark.engine

ARTIFACTS = ROOT / "test-artifacts"
CLOSED = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}},
    "required": ["name"],
    "additionalProperties": False,
}


def _chat(custom_id: str, content: str, max_tokens: int, schema: object = CLOSED) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
        },
    }


# ---------------------------------------------------------------- files and batches


def test_batch_flow_with_the_sdk(client) -> None:
    lines = [_chat(f"ok-{i}", f"Name person number {i} as JSON.", 40) for i in range(4)]
    # 4 tokens: the schema's floor ({"name":""}) is accepted, any real name is cut.
    lines.append(_chat("short", "Name a person as JSON.", 4))
    lines.append(_chat("bad-schema", "x", 8, {"type": "nope"}))
    text = "\n".join(json.dumps(line) for line in lines) + "\nnot json\n"
    uploaded = client.files.create(file=("requests.jsonl", io.BytesIO(text.encode())), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(text.encode())
    assert client.files.content(uploaded.id).read() == text.encode()
    assert uploaded.id in [f.id for f in client.files.list()]

    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "t"}
    )
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "t"}
    done = finished_batch(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 5, 1)
    assert done.errors is not None and [(e.code, e.line) for e in done.errors.data] == [("invalid_json", 7)]
    assert batch.id in [b.id for b in client.batches.list()]

    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    by_id = {line["custom_id"]: line for line in output}
    assert set(by_id) == {"ok-0", "ok-1", "ok-2", "ok-3", "short"}
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
    for i in range(4):
        choice = by_id[f"ok-{i}"]["response"]["body"]["choices"][0]
        assert choice["validation"]["status"] == "accepted"
        assert json.loads(choice["message"]["content"])["name"]
    short = by_id["short"]["response"]["body"]["choices"][0]
    assert short["finish_reason"] == "length" and short["validation"]["status"] == "truncated"

    errors = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["bad-schema"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["code"] == "invalid_schema"

    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_cancel_keeps_what_is_done(client) -> None:
    lines = [_chat(f"c-{i}", "Name a person as JSON.", 40) for i in range(40)]
    text = "\n".join(json.dumps(line) for line in lines)
    uploaded = client.files.create(file=("many.jsonl", io.BytesIO(text.encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    done = finished_batch(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    written = client.files.content(done.output_file_id).text.splitlines() if done.output_file_id else []
    assert len(written) < 40 and len({json.loads(line)["custom_id"] for line in written}) == len(written)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_batch_requests_are_refused_precisely(client, server) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-" + "0" * 32, endpoint="/v1/chat/completions", completion_window="24h"
        )
    uploaded = client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    assert exc.value.body["param"] == "endpoint"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0).files.list()
    assert (
        httpx.get(
            f"{server}/v1/files/..%2F..%2Fetc%2Fpasswd/content", headers={"Authorization": f"Bearer {KEY}"}
        ).status_code
        == 404
    )


# ---------------------------------------------------------------- the playground in chromium


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("chromium and chromedriver are not installed (scripts/test.sh installs them with apt-get)")
    return browser, driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--window-size=1400,1100", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):  # fmt: skip
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(driver, log_output=subprocess.DEVNULL))
    yield chrome
    chrome.quit()


def _run_in_page(browser, server: str, schema: dict, prompt: str, max_tokens: int) -> dict:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server}/playground")
    key = browser.find_element(By.ID, "api-key")
    key.clear()
    key.send_keys(KEY, Keys.TAB)
    WebDriverWait(browser, 30).until(lambda b: MODEL in b.find_element(By.ID, "model").text)
    editor = browser.find_element(By.ID, "schema")
    editor.send_keys(Keys.CONTROL, "a")
    editor.send_keys(Keys.DELETE)
    editor.send_keys(json.dumps(schema))  # typed, key by key
    for element_id, value in (("prompt", prompt), ("max-tokens", str(max_tokens))):
        field = browser.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(value)
    browser.find_element(By.ID, "run").click()
    WebDriverWait(browser, 180).until(lambda b: b.find_element(By.ID, "verdict").text.strip())
    return {
        "verdict": browser.find_element(By.ID, "verdict").text,
        "output": browser.find_element(By.ID, "output").text,
        "tokens": len(browser.find_elements(By.CSS_SELECTOR, "#output .tok")),
        "marks": [
            (m.get_attribute("data-pointer"), m.text) for m in browser.find_elements(By.CSS_SELECTOR, "#output mark")
        ],
        "errors": [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#errors li")],
        "partials": [
            (item.get_attribute("data-pointer"), item.get_attribute("data-status"), json.loads(value.text))
            for item in browser.find_elements(By.CSS_SELECTOR, "#partials li")
            for value in item.find_elements(By.CLASS_NAME, "value")
        ],
        "enforced": [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#enforced li")],
        "validated_only": [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#validated-only tbody tr")],
        "curl": browser.find_element(By.ID, "snippet-curl").text,
        "python": browser.find_element(By.ID, "snippet-python").text,
    }


def test_playground_streams_and_shows_the_verdict(browser, server, client) -> None:
    page = _run_in_page(browser, server, CLOSED, "Name a famous scientist as JSON.", 40)
    assert page["verdict"] == "accepted", page
    assert json.loads(page["output"])["name"] and page["tokens"] > 1  # streamed as separate pieces
    # Each field with its mark as it closed: the partials the SDK's stream of the same request gets.
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a famous scientist as JSON."}],
        max_tokens=40,
        temperature=0,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "playground", "schema": CLOSED}},
        extra_body={"partials": True},
    )
    streamed = [p for c in stream if c.choices for p in c.choices[0].delta.model_extra.get("partials") or []]
    assert page["partials"] == [(p["pointer"], p["status"], p["value"]) for p in streamed]
    assert [pointer for pointer, _, _ in page["partials"]] == ["/name"]
    assert {"maxLength", "additionalProperties"} <= set(page["enforced"]) and not page["marks"]
    assert "/v1/chat/completions" in page["curl"] and '"maxLength": 20' in page["curl"]
    assert "client.chat.completions.create(" in page["python"] and "max_tokens=40" in page["python"]
    assert KEY not in page["curl"] + page["python"]  # the snippets name an environment variable instead


def test_playground_highlights_each_error_pointer(browser, server) -> None:
    # Three booleans can never be unique: the mask allows them, validation names /flags.
    schema = {
        "type": "object",
        "properties": {
            "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3, "uniqueItems": True}
        },
        "required": ["flags"],
        "additionalProperties": False,
    }
    page = _run_in_page(browser, server, schema, "Three yes/no flags as JSON.", 48)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "playground.png"))
    assert page["verdict"] == "invalid", page
    assert any(row.startswith("/properties/flags/uniqueItems uniqueItems") for row in page["validated_only"]), page
    assert page["errors"] and "uniqueItems" in page["errors"][0]
    flags = json.loads(page["output"])["flags"]
    assert page["marks"] and all(pointer == "/flags" for pointer, _ in page["marks"])
    assert json.loads("".join(text for _, text in page["marks"])) == flags  # the mark is exactly the value


def test_playground_page_is_public_but_its_calls_need_the_key(server) -> None:
    page = httpx.get(f"{server}/playground")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere
    assert httpx.get(f"{server}/playground/playground.js").status_code == 200
    assert httpx.get(f"{server}/playground/..%2Fapp.py").status_code == 404
    assert httpx.get(f"{server}/v1/models").status_code == 401
