/**
 * Markdown for model output, rendered by kept libraries vendored into static/vendor/ (package.json's
 * `vendor` script) and loaded as classic scripts before this module: markdown-it (CommonMark with tables and
 * strikethrough), markdown-it-texmath with KaTeX (math between `$…$`, `$$…$$`, `\(…\)`, `\[…\]`),
 * highlight.js (fenced code) and DOMPurify.
 *
 * Model output is untrusted: a reply may contain `<script>`, `<img onerror=…>` or `[x](javascript:…)`. Three
 * layers keep it inert. markdown-it runs with `html: false`, so HTML in the text is escaped and shown as text;
 * links are kept only for http(s) and mailto (anything else stays literal text), images not at all; and the
 * HTML markdown-it and KaTeX produce is sanitised by DOMPurify into a DOM fragment (no scripts, no event
 * handlers, no frames) before it reaches the page. Code is highlighted by highlight.js, which escapes what it wraps.
 */

const SAFE_URL = /^(https?:\/\/|mailto:)/i;
// What DOMPurify lets through: HTML, and the MathML and SVG KaTeX draws with.
const PURIFY = { USE_PROFILES: { html: true, mathMl: true, svg: true }, RETURN_DOM_FRAGMENT: true };

let renderer = null;

/** The markdown-it instance, built on first use (the vendored scripts are loaded by then). */
function markdownIt() {
  if (renderer !== null) return renderer;
  const { markdownit, texmath, katex, hljs } = window;
  renderer = markdownit({
    html: false,
    breaks: true,
    linkify: false,
    highlight: (code, language) => (language && hljs.getLanguage(language)
      ? hljs.highlight(code, { language, ignoreIllegals: true }).value
      : ""),
  });
  renderer.validateLink = (url) => SAFE_URL.test(url.trim());
  // No images: an image URL in a reply would be fetched as soon as it is shown, which is how a prompt injection
  // sends a conversation to a third party. `![alt](url)` stays text.
  renderer.disable("image");
  renderer.use(texmath, { engine: katex, delimiters: ["dollars", "brackets"],
    katexOptions: { throwOnError: false, trust: false, output: "htmlAndMathml" } });
  return renderer;
}

/** A fenced code block gets its language's name and a copy button above it. */
function decorateCode(fragment) {
  for (const pre of fragment.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    if (!code) continue;
    const language = [...code.classList].find((c) => c.startsWith("language-"))?.slice("language-".length) ?? "";
    if (language) code.classList.add("hljs");
    const head = document.createElement("div");
    head.className = "code-head";
    const name = document.createElement("span");
    name.className = "code-lang";
    name.textContent = language || "text";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "btn btn-link btn-small code-copy";
    copy.textContent = "Copy";
    copy.title = "Copy this code";
    copy.addEventListener("click", () => {
      navigator.clipboard?.writeText(code.textContent).then(() => { copy.textContent = "Copied"; }, () => {});
    });
    head.append(name, copy);
    const box = document.createElement("div");
    box.className = "code-block";
    pre.replaceWith(box);
    box.append(head, pre);
  }
}

/** Render Markdown text into a sanitised DocumentFragment. */
export function renderMarkdown(text) {
  const fragment = window.DOMPurify.sanitize(markdownIt().render(String(text)), PURIFY);
  for (const link of fragment.querySelectorAll("a")) {
    link.target = "_blank";
    link.rel = "noopener noreferrer";
  }
  // The site's Content-Security-Policy refuses style attributes in markup; KaTeX lays formulas out with them
  // (and markdown-it aligns table columns), so they are applied again through CSSOM, which the policy allows.
  // Only markdown-it and KaTeX write them: the reply's own HTML never gets this far (`html: false`).
  for (const node of fragment.querySelectorAll("[style]")) {
    const css = node.getAttribute("style");
    node.removeAttribute("style");
    node.style.cssText = css;
  }
  decorateCode(fragment);
  return fragment;
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
