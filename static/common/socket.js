/**
 * A JSON websocket that reconnects by itself.
 *
 * Both pages hold a socket for their whole life; a server restart or a dropped proxy connection should cost
 * the user a short "reconnecting" badge, not a page reload. Reconnects back off exponentially up to a cap.
 */
import { noteClose, noteOpen } from "./restart.js";

/** The absolute ws:// or wss:// URL of a server path, matching the page's own scheme and host. */
export function socketUrl(path) {
  const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${window.location.host}${path}`;
}

export class JsonSocket {
  /**
   * @param {string} path  server path such as "/ws/chat/"
   * @param {{onMessage: (msg: object) => void, onStatus?: (status: "connecting"|"open"|"closed") => void,
   *          minDelayMs?: number, maxDelayMs?: number}} options
   */
  constructor(path, { onMessage, onStatus = () => {}, minDelayMs = 500, maxDelayMs = 8000 }) {
    this.url = socketUrl(path);
    this.onMessage = onMessage;
    this.onStatus = onStatus;
    this.minDelayMs = minDelayMs;
    this.maxDelayMs = maxDelayMs;
    this.delayMs = minDelayMs;
    this.ws = null;
    this.stopped = false;
    this.timer = null;
  }

  /** Open the socket (and keep reopening it after drops until close() is called). */
  connect() {
    this.stopped = false;
    this.onStatus("connecting");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.addEventListener("open", () => {
      noteOpen();
      this.delayMs = this.minDelayMs;
      this.onStatus("open");
    });
    ws.addEventListener("message", (event) => {
      let msg;
      try {
        msg = JSON.parse(event.data);
      } catch {
        console.warn("ignoring a frame that is not JSON", event.data);
        return;
      }
      this.onMessage(msg);
    });
    ws.addEventListener("close", (event) => {
      if (this.ws !== ws) return;
      noteClose(event);
      this.ws = null;
      this.onStatus("closed");
      if (!this.stopped) this.scheduleReconnect();
    });
  }

  scheduleReconnect() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), this.delayMs);
    this.delayMs = Math.min(this.delayMs * 2, this.maxDelayMs);
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  /** Send one JSON message; returns false (and sends nothing) while the socket is not open. */
  send(message) {
    if (!this.isOpen) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }

  /** Close for good: no more reconnects. */
  close() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close();
    this.ws = null;
  }
}
