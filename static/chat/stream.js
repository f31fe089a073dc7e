/**
 * The state of one streaming reply, kept apart from the DOM so its rules are easy to read and to test.
 *
 * Token deltas append to the text of their sample (`index`). Deltas are numbered by `seq`; a jump in `seq`
 * means a delta was lost on the way, which is flagged but not fatal: the `done` message carries the full
 * final text of every sample and replaces whatever was streamed, so the shown (and saved) reply is always
 * the server's.
 */

export class ReplyStream {
  /** @param {number} n  number of samples requested (they stream side by side) */
  constructor(n) {
    if (!Number.isInteger(n) || n < 1) throw new Error(`n must be a positive integer, got ${n}`);
    this.requestId = null;
    this.texts = Array.from({ length: n }, () => "");
    this.finishReasons = Array.from({ length: n }, () => null);
    this.expectedSeq = null;
    this.gaps = 0;
    this.done = false;
    this.usage = null;
    this.timing = null;
    this.receipt = null;
    this.promptSegments = null;
    this.context = null; // what the worker fitted into the context window (docs/protocol.md)
  }

  /** `started`: the server accepted the request under this id. */
  start(requestId) {
    this.requestId = requestId;
  }

  /**
   * Apply one `token` message. Returns the sample index it touched, or null if the delta was ignored
   * (it belongs to another request, arrives after `done`, or repeats a seq already seen).
   */
  applyToken({ request_id: requestId, index = 0, seq, text }) {
    if (this.done || requestId !== this.requestId) return null;
    if (!Number.isInteger(index) || index < 0 || index >= this.texts.length) return null;
    if (Number.isInteger(seq)) {
      if (this.expectedSeq !== null && seq < this.expectedSeq) return null;
      if (this.expectedSeq !== null && seq > this.expectedSeq) this.gaps += seq - this.expectedSeq;
      this.expectedSeq = seq + 1;
    }
    this.texts[index] += text ?? "";
    return index;
  }

  /** `done`: the final texts replace the streamed ones; usage and timing become the reply's stats. */
  finish({ outputs = [], usage = null, timing = null, receipt = null, prompt_segments: promptSegments = null,
           context = null }) {
    for (const out of outputs) {
      const index = out.index ?? 0;
      if (index < 0 || index >= this.texts.length) continue;
      this.texts[index] = out.text ?? "";
      this.finishReasons[index] = out.finish_reason ?? null;
    }
    this.usage = usage;
    this.timing = timing;
    this.receipt = receipt;
    this.promptSegments = promptSegments;
    this.context = context;
    this.done = true;
  }

  /** The stream ended without `done` (cancelled, server error, socket lost): keep what arrived. */
  fail(reason) {
    this.finishReasons = this.finishReasons.map((r) => r ?? reason);
    this.done = true;
  }
}
