/**
 * "View code": the curl command and the Python `openai` client call that ask this server's
 * /v1/chat/completions for what the chat page would ask for now: the model, the conversation (system prompt
 * included, and the message being written), the response format, and every sampling field whose value
 * differs from the API's default.
 *
 * Which fields there are, what the API calls them, their API defaults and which ones are vLLM's extras (the
 * `openai` client passes those in `extra_body`) all come from the served sampling specs (`chat_config.sampling`,
 * built from the one table in playground/serving/web/sampling.py): nothing here names a field.
 */

import { Dialog } from "./dialog.js";

const KEY_VARIABLE = "PLAYGROUND_API_KEY"; // an API key (docs/api.md); "EMPTY" serves loopback clients keyless

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * The request body, in the API's names: `params` as the page sends them on its socket, mapped through each
 * spec's `api` ({name, default, with, vllm_extra}); values at the API's default are left out.
 * @returns {{body: object, extra: Set<string>}}  `extra`: the body's vLLM-only keys
 */
export function requestBody({ model, messages, params, specs, responseFormat = null }) {
  const body = { model, messages };
  const extra = new Set();
  for (const spec of specs) {
    const value = params[spec.name];
    if (value === undefined || same(value, spec.api.default)) continue;
    body[spec.api.name] = value;
    Object.assign(body, spec.api.with);
    if (spec.api.vllm_extra) extra.add(spec.api.name);
  }
  if (responseFormat) body.response_format = responseFormat;
  body.stream = true;
  return { body, extra };
}

/** A word for bash, in single quotes: a quote inside is closed, written escaped, and reopened ('\''). */
export function shellQuote(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

export function curlSnippet(endpoint, body) {
  return [
    `curl -N ${shellQuote(endpoint)} \\`,
    `  -H 'Content-Type: application/json' \\`,
    `  -H "Authorization: Bearer \${${KEY_VARIABLE}:-EMPTY}" \\`,
    `  -d ${shellQuote(JSON.stringify(body, null, 2))}`,
  ].join("\n");
}

/**
 * A Python literal for a JSON value: JSON's spelling of strings and numbers is Python's (U+2028 and U+2029,
 * which JSON leaves raw, are escaped too), true/false/null are True/False/None.
 */
export function pythonLiteral(value) {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (Array.isArray(value)) return `[${value.map(pythonLiteral).join(", ")}]`;
  if (typeof value === "object") {
    return `{${Object.entries(value).map(([k, v]) => `${pythonLiteral(k)}: ${pythonLiteral(v)}`).join(", ")}}`;
  }
  return JSON.stringify(value).replace(/[\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16)}`);
}

export function pythonSnippet(endpoint, { body, extra }) {
  const baseUrl = endpoint.replace(/\/chat\/completions$/, "");
  const args = [`    model=${pythonLiteral(body.model)},`, "    messages=["];
  for (const message of body.messages) args.push(`        ${pythonLiteral(message)},`);
  args.push("    ],");
  const extras = {};
  for (const [key, value] of Object.entries(body)) {
    if (key === "model" || key === "messages" || key === "stream") continue;
    if (extra.has(key)) extras[key] = value;
    else args.push(`    ${key}=${pythonLiteral(value)},`);
  }
  if (Object.keys(extras).length > 0) args.push(`    extra_body=${pythonLiteral(extras)},`);
  args.push(`    stream=${pythonLiteral(body.stream)},`);
  return [
    "import os",
    "",
    "from openai import OpenAI",
    "",
    "client = OpenAI(",
    `    base_url=${pythonLiteral(baseUrl)},`,
    `    api_key=os.environ.get(${pythonLiteral(KEY_VARIABLE)}, "EMPTY"),`,
    ")",
    "stream = client.chat.completions.create(",
    ...args,
    ")",
    "samples = {}  # index -> text: with n > 1 the samples stream interleaved",
    "for chunk in stream:",
    "    for choice in chunk.choices:",
    "        samples[choice.index] = samples.get(choice.index, \"\") + (choice.delta.content or \"\")",
    "for index, text in sorted(samples.items()):",
    "    print(text if len(samples) == 1 else f\"--- sample {index + 1}\\n{text}\")",
  ].join("\n");
}

/** The dialog: a snippet per client, each with a Copy button; rebuilt from the page's state on each opening. */
export class CodeDialog {
  /**
   * @param {{specs: object[], endpoint: string, current: () => {model: string, messages: object[],
   *          params: object, responseFormat: object|null, note: string}}} options  `current` reads the page now
   */
  constructor({ specs, endpoint, current }) {
    this.specs = specs;
    this.endpoint = endpoint;
    this.current = current;
    this.dialog = new Dialog("View code", "code-dialog");
    this.note = document.createElement("p");
    this.note.className = "code-note";
    this.snippets = {};
    this.dialog.body.append(this.note);
    for (const [lang, title] of [["curl", "curl"], ["python", "Python (openai)"]]) {
      const section = document.createElement("section");
      section.className = "code-snippet";
      section.dataset.lang = lang;
      const head = document.createElement("div");
      head.className = "code-snippet-head";
      const heading = document.createElement("h3");
      heading.textContent = title;
      const copy = document.createElement("button");
      copy.type = "button";
      copy.className = "btn btn-small code-snippet-copy";
      copy.textContent = "Copy";
      copy.addEventListener("click", () => this.copy(lang, copy));
      head.append(heading, copy);
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      pre.append(code);
      section.append(head, pre);
      this.snippets[lang] = code;
      this.dialog.body.append(section);
    }
  }

  open() {
    const { model, messages, params, responseFormat, note } = this.current();
    const request = requestBody({ model, messages, params, specs: this.specs, responseFormat });
    this.snippets.curl.textContent = curlSnippet(this.endpoint, request.body);
    this.snippets.python.textContent = pythonSnippet(this.endpoint, request);
    this.note.textContent = "The request the chat would send now, on this server's OpenAI-compatible API "
      + `(${this.endpoint}): the conversation so far${note}, the model and every setting that differs from `
      + "the API's default. "
      + `Set ${KEY_VARIABLE} to an API key (Account settings); clients on this machine may go without one.`;
    this.dialog.open();
  }

  async copy(lang, button) {
    try {
      await navigator.clipboard.writeText(this.snippets[lang].textContent);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  }
}
