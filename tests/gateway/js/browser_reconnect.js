// The browser page across a drain: a short turn, then a long one that is streaming when
// the test (told by the "streaming" line on stdout) drains the replica; the page lets it
// finish, reconnects with its session id, shows the history and takes a third turn.
// Usage: node browser_reconnect.js URL   (prints a JSON summary as its last line)
"use strict";
const { withPage } = require("./chromium_page");

const [url] = process.argv.slice(2);
const QUESTIONS = ["What is the capital of France?", "Count from one to thirty in words.",
                   "Thank you."];

async function ask(page, text, metas) {
  await page.fill("#input", text);
  await page.keyboard.press("Enter");
  if (metas) await waitMetas(page, metas);
}

function waitMetas(page, n) {
  return page.waitForFunction((k) => document.querySelectorAll(".msg.assistant .meta").length === k,
                              n, { timeout: 120000 });
}

async function main() {
  await withPage(async (page) => {
    const hellos = [], dones = [];  // read off the page's own sockets
    page.on("websocket", (ws) => ws.on("framereceived", ({ payload }) => {
      const frame = JSON.parse(payload.toString());
      if (frame.type === "hello") hellos.push({ instance: frame.instance, resumed: frame.resumed });
      if (frame.type === "done") dones.push(frame.finish_reason);
    }));
    await page.goto(url);
    await page.waitForSelector("#status.on", { timeout: 30000 });
    await ask(page, QUESTIONS[0], 1);
    await ask(page, QUESTIONS[1]);
    await page.waitForFunction(() => {
      const el = document.querySelector(".msg.assistant.streaming");
      return el && el.textContent.length > 0;
    }, null, { timeout: 60000 });
    console.log("streaming");
    while (hellos.length < 2) await new Promise((r) => setTimeout(r, 100));
    await page.waitForSelector("#status.on", { timeout: 30000 });
    // The resumed history is drawn again (without meta lines): the third reply is done
    // when the last assistant message has one.
    await ask(page, QUESTIONS[2]);
    await page.waitForFunction(() => {
      const all = document.querySelectorAll(".msg.assistant");
      return all.length === 3 && all[2].querySelector(".meta");
    }, null, { timeout: 120000 });
    const users = await page.$$eval(".msg.user", (els) => els.map((e) => e.textContent));
    console.log(JSON.stringify({ hellos, users, dones }));
  });
}

main().catch((e) => { console.error(e); process.exit(1); });
