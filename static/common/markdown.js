/**
 * A small Markdown renderer that is safe by construction.
 *
 * Model output is untrusted: a reply may contain `<script>` or `<img onerror=...>`. Instead of producing an
 * HTML string and sanitising it afterwards, this renderer builds DOM nodes and only ever assigns text through
 * `textContent`, so no character of the input can become markup. Links are kept only for http(s) and mailto.
 *
 * Supported: fenced code blocks, headings, paragraphs with line breaks, bullet and numbered lists,
 * block quotes, horizontal rules, `inline code`, **bold**, *italic* / _italic_, ~~strike~~ and [links](url).
 */

const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const SAFE_URL = /^(https?:\/\/|mailto:)/i;

/** Inline patterns, tried left to right; the earliest match in the text wins. */
const INLINE_RULES = [
  { re: /`([^`\n]+)`/, build: (m) => textElement("code", m[1]) },
  { re: /\*\*(?=\S)([\s\S]*?\S)\*\*/, build: (m) => wrap("strong", m[1]) },
  { re: /~~(?=\S)([\s\S]*?\S)~~/, build: (m) => wrap("del", m[1]) },
  { re: /(?<![\w*])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?![\w*])/, build: (m) => wrap("em", m[1]) },
  { re: /(?<![\w_])_(?=[^\s_])([^_\n]*?[^\s_])_(?![\w_])/, build: (m) => wrap("em", m[1]) },
  { re: /\[([^\]\n]+)\]\(([^)\s]+)\)/, build: (m) => link(m[1], m[2]) },
];

function textElement(tag, text) {
  const el = document.createElement(tag);
  el.textContent = text;
  return el;
}

function wrap(tag, inner) {
  const el = document.createElement(tag);
  el.append(renderInline(inner));
  return el;
}

function link(label, url) {
  if (!SAFE_URL.test(url)) return document.createTextNode(`[${label}](${url})`);
  const a = document.createElement("a");
  a.href = url;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  a.append(renderInline(label));
  return a;
}

/** Render inline Markdown of one block into a fragment of text nodes and safe elements. */
export function renderInline(text) {
  const frag = document.createDocumentFragment();
  let rest = text;
  while (rest.length > 0) {
    let best = null;
    for (const rule of INLINE_RULES) {
      const m = rule.re.exec(rest);
      if (m && (best === null || m.index < best.m.index)) best = { m, rule };
    }
    if (best === null) {
      frag.append(document.createTextNode(rest));
      break;
    }
    if (best.m.index > 0) frag.append(document.createTextNode(rest.slice(0, best.m.index)));
    frag.append(best.rule.build(best.m));
    rest = rest.slice(best.m.index + best.m[0].length);
  }
  return frag;
}

/** Paragraph text keeps the model's single line breaks visible. */
function paragraph(lines) {
  const p = document.createElement("p");
  lines.forEach((line, i) => {
    if (i > 0) p.append(document.createElement("br"));
    p.append(renderInline(line));
  });
  return p;
}

function codeBlock(lines, lang) {
  const pre = document.createElement("pre");
  const code = textElement("code", lines.join("\n"));
  if (lang) code.dataset.lang = lang;
  pre.append(code);
  return pre;
}

function list(items, ordered, start) {
  const el = document.createElement(ordered ? "ol" : "ul");
  if (ordered && start !== 1) el.start = start;
  for (const item of items) {
    const li = document.createElement("li");
    li.append(renderInline(item));
    el.append(li);
  }
  return el;
}

/**
 * Render Markdown text into a DocumentFragment.
 * An unterminated code fence (common while a reply is still streaming) renders as a code block to the end.
 */
export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      const closes = (line) => line.trim().startsWith(fence[1]) && line.trim().replace(/`|~/g, "") === "";
      while (i < lines.length && !closes(lines[i])) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1; // closing fence (or past the end)
      frag.append(codeBlock(body, fence[2]));
      continue;
    }
    if (line.trim() === "") {
      i += 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const h = document.createElement(`h${heading[1].length}`);
      h.append(renderInline(heading[2]));
      frag.append(h);
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      frag.append(document.createElement("hr"));
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(QUOTE.exec(lines[i++])[1]);
      const q = document.createElement("blockquote");
      q.append(renderMarkdown(body.join("\n")));
      frag.append(q);
      continue;
    }
    const listRe = BULLET.test(line) ? BULLET : NUMBERED.test(line) ? NUMBERED : null;
    if (listRe) {
      const ordered = listRe === NUMBERED;
      const start = ordered ? Number(NUMBERED.exec(line)[1]) : 1;
      const items = [];
      while (i < lines.length && listRe.test(lines[i])) {
        const m = listRe.exec(lines[i++]);
        items.push(ordered ? m[2] : m[1]);
      }
      frag.append(list(items, ordered, start));
      continue;
    }
    const body = [];
    while (
      i < lines.length && lines[i].trim() !== "" && !FENCE.test(lines[i]) && !HEADING.test(lines[i]) &&
      !QUOTE.test(lines[i]) && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i]) && !RULE.test(lines[i])
    ) {
      body.push(lines[i++]);
    }
    frag.append(paragraph(body));
  }
  return frag;
}

/** Render `text` into `target`, as Markdown or as plain preformatted text, replacing what was there. */
export function renderInto(target, text, { markdown = true } = {}) {
  if (markdown) {
    target.replaceChildren(renderMarkdown(text));
  } else {
    target.textContent = text;
  }
  target.classList.toggle("md", markdown);
  target.classList.toggle("plain", !markdown);
}
