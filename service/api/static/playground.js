// tokenmold playground: a schema, a prompt and sampling options in; the output streamed token by
// token from /v1/chat/completions (response_format json_schema), each field listed with its mark
// the moment it closes (tokenmold's `partials`), then the verdict with each error pointer
// highlighted in the text, the keyword report, and the same request as curl and Python.
// No framework and no build step: this file is served as is by `tokenmold serve`.
"use strict";

const EXAMPLES = {
  "person (closed object)": {
    prompt: "Give me a famous scientist as JSON.",
    maxTokens: 96,
    schema: {
      type: "object",
      properties: {
        name: { type: "string", maxLength: 40 },
        born: { type: "integer", minimum: 1000, maximum: 2025 },
        field: { type: "string", enum: ["physics", "chemistry", "biology", "mathematics"] },
      },
      required: ["name", "born", "field"],
      additionalProperties: false,
    },
  },
  "invoice (array of items)": {
    prompt: "An invoice for two coffees and a croissant, as JSON.",
    maxTokens: 160,
    schema: {
      type: "object",
      properties: {
        items: {
          type: "array",
          minItems: 1,
          maxItems: 5,
          items: {
            type: "object",
            properties: {
              product: { type: "string", maxLength: 30 },
              quantity: { type: "integer", minimum: 1, maximum: 10 },
              price: { type: "number", minimum: 0 },
            },
            required: ["product", "quantity", "price"],
            additionalProperties: false,
          },
        },
        currency: { type: "string", pattern: "^[A-Z]{3}$" },
      },
      required: ["items", "currency"],
      additionalProperties: false,
    },
  },
  "sentiment (enum)": {
    prompt: "Classify the sentiment of: 'The battery died after an hour.'",
    maxTokens: 24,
    schema: {
      type: "object",
      properties: { sentiment: { enum: ["positive", "neutral", "negative"] } },
      required: ["sentiment"],
      additionalProperties: false,
    },
  },
  "uniqueItems (validated only)": {
    prompt: "Three yes/no flags as JSON.",
    maxTokens: 48,
    schema: {
      type: "object",
      properties: {
        flags: { type: "array", items: { type: "boolean" }, minItems: 3, maxItems: 3, uniqueItems: true },
      },
      required: ["flags"],
      additionalProperties: false,
    },
  },
  "too few tokens (truncated)": {
    prompt: "List five cities with their countries as JSON.",
    maxTokens: 12,
    schema: {
      type: "object",
      properties: {
        cities: {
          type: "array",
          items: {
            type: "object",
            properties: { city: { type: "string" }, country: { type: "string" } },
            required: ["city", "country"],
            additionalProperties: false,
          },
        },
      },
      required: ["cities"],
      additionalProperties: false,
    },
  },
};

const KEY_STORAGE = "tokenmold-api-key";
const $ = (id) => document.getElementById(id);
let modelId = null;
let controller = null;

// ------------------------------------------------------------------ the API key and the model

function authHeaders() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: authHeaders() });
    const body = await response.json();
    if (!response.ok) {
      modelId = null;
      $("model").textContent = response.status === 401 ? "model: enter the API key" : `model: ${body.error.message}`;
      return;
    }
    modelId = body.data[0].id;
    $("model").textContent = `model: ${modelId}`;
  } catch (error) {
    $("model").textContent = `model: unreachable (${error})`;
  }
}

// ------------------------------------------------------------------ the request

function requestBody() {
  let schema;
  try {
    schema = JSON.parse($("schema").value);
  } catch (error) {
    throw new Error(`the schema is not valid JSON: ${error.message}`);
  }
  const body = {
    model: modelId,
    messages: [{ role: "user", content: $("prompt").value }],
    max_tokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    response_format: {
      type: "json_schema",
      json_schema: { name: "playground", schema, strict: $("strict").checked },
    },
  };
  if (Number($("top-p").value) !== 1) body.top_p = Number($("top-p").value);
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  return body;
}

async function run() {
  reset();
  await loadModel(); // the key may have changed since the page loaded
  let body;
  try {
    body = requestBody();
  } catch (error) {
    show("schema-error", error.message);
    return;
  }
  renderSnippets(body);
  controller = new AbortController();
  setRunning(true);
  const started = performance.now();
  let text = "";
  let tokens = 0;
  let validation = null;
  let finish = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      // partials: tokenmold's extension, so not in the snippets (the openai SDK would need extra_body).
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true }, partials: true }),
      signal: controller.signal,
    });
    if (!response.ok) {
      const error = (await response.json()).error;
      show("request-error", `${response.status} ${error.code || error.type}: ${error.message}`);
      return;
    }
    for await (const chunk of events(response)) {
      if (chunk.error) {
        show("request-error", chunk.error.message);
        continue;
      }
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      for (const choice of chunk.choices || []) {
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          text += piece;
          appendToken(piece);
          tokens += 1;
          $("stats").textContent = `${tokens} tokens, ${((performance.now() - started) / 1000).toFixed(1)} s`;
        }
        for (const partial of (choice.delta && choice.delta.partials) || []) appendPartial(partial);
        if (choice.validation) validation = choice.validation;
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    $("stats").textContent = `${tokens} tokens, ${((performance.now() - started) / 1000).toFixed(1)} s`;
    if (validation) renderVerdict(text, validation, finish);
  } catch (error) {
    if (error.name !== "AbortError") show("request-error", String(error));
    else $("state").textContent = "stopped";
  } finally {
    setRunning(false);
  }
}

// Server-sent events: `data: <json>` blocks separated by a blank line, `data: [DONE]` last.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

// ------------------------------------------------------------------ rendering

function reset() {
  for (const id of ["output", "partials", "errors", "enforced", "verdict", "finish", "stats"]) $(id).textContent = "";
  $("validated-only").querySelector("tbody").textContent = "";
  $("verdict").className = "status";
  for (const id of ["schema-error", "request-error"]) $(id).hidden = true;
}

function show(id, message) {
  $(id).textContent = message;
  $(id).hidden = false;
}

function setRunning(running) {
  $("run").disabled = running;
  $("stop").disabled = !running;
  $("state").textContent = running ? "streaming…" : "done";
}

function appendToken(piece) {
  const span = document.createElement("span");
  span.className = "tok";
  span.textContent = piece;
  $("output").appendChild(span);
}

// One closed field: its mark (accepted or invalid, the errors as its title), its pointer, its value.
function appendPartial(partial) {
  const item = document.createElement("li");
  item.dataset.pointer = partial.pointer;
  item.dataset.status = partial.status;
  const mark = document.createElement("span");
  mark.className = `mark ${partial.status}`;
  mark.textContent = partial.status === "accepted" ? "✓" : "✗";
  mark.title = (partial.errors || []).map((error) => `${error.keyword}: ${error.message}`).join("\n") || partial.status;
  const pointer = document.createElement("code");
  pointer.textContent = partial.pointer;
  const value = document.createElement("span");
  value.className = "value";
  value.textContent = JSON.stringify(partial.value);
  item.append(mark, pointer, value);
  $("partials").appendChild(item);
}

function renderVerdict(text, validation, finish) {
  $("verdict").textContent = validation.status;
  $("verdict").className = `status ${validation.status}`;
  $("finish").textContent = finish ? `finish_reason: ${finish}` : "";
  const ranges = valueRanges(text);
  const errors = validation.errors || [];
  errors.forEach((error, index) => {
    const item = document.createElement("li");
    item.dataset.error = String(index);
    const pointer = document.createElement("code");
    pointer.textContent = error.path === "" ? "(whole output)" : error.path;
    item.append(pointer, ` ${error.keyword}: ${error.message}`);
    item.addEventListener("mouseenter", () => focusError(index, true));
    item.addEventListener("mouseleave", () => focusError(index, false));
    $("errors").appendChild(item);
  });
  if (errors.length) highlight(text, errors, ranges);
  const keywords = validation.keywords || { enforced: [], validated_only: [] };
  for (const keyword of keywords.enforced) {
    const chip = document.createElement("li");
    chip.textContent = keyword;
    $("enforced").appendChild(chip);
  }
  const rows = $("validated-only").querySelector("tbody");
  for (const note of keywords.validated_only) {
    const row = rows.insertRow();
    for (const cell of [note.pointer || "(root)", note.keyword, note.reason]) row.insertCell().textContent = cell;
  }
}

function focusError(index, on) {
  for (const mark of document.querySelectorAll(`#output mark[data-error="${index}"]`)) mark.classList.toggle("focus", on);
}

// Replace the streamed spans by the text with each error's value marked: a character belongs to
// the most precise error that covers it (the shortest range).
function highlight(text, errors, ranges) {
  const spans = errors.map((error) => rangeOf(error.path, ranges, text.length));
  const owner = new Array(text.length).fill(-1);
  spans.forEach(([start, end], index) => {
    for (let i = start; i < end; i++) {
      const current = owner[i];
      if (current < 0 || end - start < spans[current][1] - spans[current][0]) owner[i] = index;
    }
  });
  const output = $("output");
  output.textContent = "";
  let i = 0;
  while (i < text.length) {
    let j = i;
    while (j < text.length && owner[j] === owner[i]) j++;
    const piece = text.slice(i, j);
    if (owner[i] < 0) {
      output.append(piece);
    } else {
      const error = errors[owner[i]];
      const mark = document.createElement("mark");
      mark.dataset.error = String(owner[i]);
      mark.dataset.pointer = error.path;
      mark.title = `${error.path || "(whole output)"} ${error.keyword}: ${error.message}`;
      mark.textContent = piece;
      output.appendChild(mark);
    }
    i = j;
  }
}

// The range of the value a JSON Pointer names; a pointer that is not in the text (a missing
// property, a cut-off output) falls back to its nearest enclosing value, then to the whole text.
function rangeOf(pointer, ranges, length) {
  let current = pointer;
  for (;;) {
    if (ranges.has(current)) return ranges.get(current);
    if (current === "") return [0, length];
    current = current.slice(0, current.lastIndexOf("/"));
  }
}

// JSON Pointer -> [start, end) of every value in `text`, by a small position-keeping parser. A
// cut-off text keeps the values it completed; a value left open runs to the end of the text.
function valueRanges(text) {
  const ranges = new Map();
  let i = 0;
  const space = () => {
    while (i < text.length && " \t\r\n".includes(text[i])) i++;
  };
  const fail = () => {
    throw new Error("incomplete");
  };
  const string = () => {
    const start = i;
    if (text[i] !== '"') fail();
    i++;
    while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    if (i >= text.length) fail();
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const escape = (key) => key.replace(/~/g, "~0").replace(/\//g, "~1");
  const value = (pointer) => {
    space();
    const start = i;
    ranges.set(pointer, [start, text.length]);
    if (text[i] === "{") {
      i++;
      space();
      if (text[i] === "}") i++;
      else
        for (;;) {
          space();
          const key = string();
          space();
          if (text[i] !== ":") fail();
          i++;
          value(`${pointer}/${escape(key)}`);
          space();
          if (text[i] === ",") { i++; continue; }
          if (text[i] === "}") { i++; break; }
          fail();
        }
    } else if (text[i] === "[") {
      i++;
      space();
      if (text[i] === "]") i++;
      else
        for (let index = 0; ; index++) {
          value(`${pointer}/${index}`);
          space();
          if (text[i] === ",") { i++; continue; }
          if (text[i] === "]") { i++; break; }
          fail();
        }
    } else if (text[i] === '"') {
      string();
    } else {
      const literal = /^(-?\d+(\.\d+)?([eE][+-]?\d+)?|true|false|null)/.exec(text.slice(i));
      if (!literal) fail();
      i += literal[0].length;
    }
    ranges.set(pointer, [start, i]);
  };
  try {
    value("");
  } catch (error) {
    // partial output: the ranges recorded so far stand
  }
  return ranges;
}

// ------------------------------------------------------------------ snippets

function renderSnippets(body) {
  const base = window.location.origin;
  const key = $("api-key").value.trim() ? "$TOKENMOLD_API_KEY" : "unused";
  const json = JSON.stringify(body, null, 2);
  $("snippet-curl").textContent =
    `curl -s ${base}/v1/chat/completions \\\n` +
    `  -H "Authorization: Bearer ${key}" -H "Content-Type: application/json" \\\n` +
    `  -d '${json.replace(/'/g, "'\\''")}'`;
  const { model, messages, response_format: format, ...sampling } = body;
  const args = Object.entries(sampling).map(([name, value]) => `    ${name}=${pythonValue(value)},`);
  $("snippet-python").textContent = [
    "import os",
    "",
    "import openai",
    "",
    `client = openai.OpenAI(base_url="${base}/v1", api_key=os.environ.get("TOKENMOLD_API_KEY", "unused"))`,
    "completion = client.chat.completions.create(",
    `    model=${pythonValue(model)},`,
    `    messages=${pythonValue(messages)},`,
    ...args,
    `    response_format=${pythonValue(format)},`,
    ")",
    "choice = completion.choices[0]",
    'print(choice.message.content, choice.model_extra["validation"])',
  ].join("\n");
}

function pythonValue(value) {
  if (value === null) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (Array.isArray(value)) return `[${value.map(pythonValue).join(", ")}]`;
  if (typeof value === "object") {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${pythonValue(v)}`).join(", ")}}`;
  }
  return JSON.stringify(value);
}

async function copy(id) {
  const text = $(id).textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch (error) {
    const range = document.createRange();
    range.selectNodeContents($(id));
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    document.execCommand("copy");
  }
}

// ------------------------------------------------------------------ start

function useExample(name) {
  const example = EXAMPLES[name];
  $("schema").value = JSON.stringify(example.schema, null, 2);
  $("prompt").value = example.prompt;
  $("max-tokens").value = example.maxTokens;
}

for (const name of Object.keys(EXAMPLES)) $("example").add(new Option(name, name));
$("example").addEventListener("change", (event) => useExample(event.target.value));
$("api-key").value = sessionStorage.getItem(KEY_STORAGE) || "";
$("api-key").addEventListener("input", () => sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim()));
$("api-key").addEventListener("change", loadModel);
$("run").addEventListener("click", run);
$("stop").addEventListener("click", () => controller && controller.abort());
for (const button of document.querySelectorAll("button.copy")) button.addEventListener("click", () => copy(button.dataset.copy));
useExample(Object.keys(EXAMPLES)[0]);
loadModel();
