/**
 * The chat page's dialogs (View code, keyboard shortcuts): a native modal <dialog>, so the browser does the
 * rest (the page behind is inert, Escape closes it); on closing, the keyboard focus goes back to where it was.
 */

let dialogCount = 0;

export class Dialog {
  /**
   * @param {string} title  the dialog's heading (also its accessible name)
   * @param {string} className  a class for its styles and for tests to find it
   */
  constructor(title, className) {
    dialogCount += 1;
    this.el = document.createElement("dialog");
    this.el.className = `chat-dialog ${className}`;
    const heading = document.createElement("h2");
    heading.className = "dialog-title";
    heading.id = `dialog-title-${dialogCount}`;
    heading.textContent = title;
    this.el.setAttribute("aria-labelledby", heading.id);
    const close = document.createElement("button");
    close.type = "button";
    close.className = "btn btn-icon dialog-close";
    close.textContent = "×";
    close.setAttribute("aria-label", "Close");
    close.addEventListener("click", () => this.close());
    const head = document.createElement("div");
    head.className = "dialog-head";
    head.append(heading, close);
    this.body = document.createElement("div");
    this.body.className = "dialog-body";
    this.el.append(head, this.body);
    this.opener = null;
    this.el.addEventListener("close", () => {
      if (this.opener?.isConnected) this.opener.focus();
      this.opener = null;
    });
    // A click on the backdrop (outside the dialog's box) closes it, as Escape does.
    this.el.addEventListener("click", (event) => {
      if (event.target !== this.el) return;
      const box = this.el.getBoundingClientRect();
      const inside = event.clientX >= box.left && event.clientX <= box.right && event.clientY >= box.top
        && event.clientY <= box.bottom;
      if (!inside) this.close();
    });
    document.body.append(this.el);
  }

  get isOpen() {
    return this.el.open;
  }

  /** Show it, remembering the focused element to return to. */
  open() {
    if (this.el.open) return;
    this.opener = document.activeElement;
    this.el.showModal();
  }

  close() {
    if (this.el.open) this.el.close();
  }
}
