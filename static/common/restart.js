/**
 * "Server restarting": the web process closes every socket with 1001 and that reason on SIGTERM (a redeploy,
 * playground/serving/web/shutdown.py). The socket reconnects by itself (socket.js); this shows the page why it
 * is waiting, in a banner of its own, until the socket is open again.
 */
const GOING_AWAY = 1001;
const BANNER_ID = "server-restarting";

/** Call from a socket's "close" listener. */
export function noteClose(event) {
  if (event.code !== GOING_AWAY || document.getElementById(BANNER_ID)) return;
  const banner = document.createElement("div");
  banner.id = BANNER_ID;
  banner.setAttribute("role", "status");
  banner.textContent = "server restarting: reconnecting…";
  document.body.prepend(banner);
}

/** Call from a socket's "open" listener. */
export function noteOpen() {
  document.getElementById(BANNER_ID)?.remove();
}
