// Drive the browser chat page through a two-turn chat in headless Chromium, screenshot it,
// then start a third, long reply and end it with the Stop button.
// Usage: node browser_chat.js URL SCREENSHOT_PATH   (prints a JSON summary on stdout)
// playwright-core comes from tests/gateway/js/node_modules; the browser is Debian's chromium.
"use strict";
const { withPage } = require("./chromium_page");

const [url, screenshot] = process.argv.slice(2);
// The first prompt spans three full KV blocks, so that turn 2's cached prefix shows more
// than the system prompt's two blocks that every chat shares.
const QUESTIONS = [
  "Please answer in one short sentence, in plain English, for a school quiz: what is the " +
  "capital of France?",
  "And what is its most famous tower?"];
// The default model's greedy reply to this runs past 300 tokens with the quantized dots
// at two activation levels (AVX2) and at three; "Count from one to one hundred in words."
// got "One hundred is not a number." (8 tokens) and ended before Stop could land.
const LONG_QUESTION = "Write a long story about a dragon and a knight.";

async function main() {
  await withPage(async (page) => {
    const consoleErrors = [];
    page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
    const usages = [];  // each `done` frame's usage, read off the page's own socket
    page.on("websocket", (ws) => ws.on("framereceived", ({ payload }) => {
      const frame = JSON.parse(payload.toString());
      if (frame.type === "done") usages.push(frame.usage);
    }));
    await page.goto(url);
    await page.waitForSelector("#status.on", { timeout: 30000 });
    const replies = [];
    for (let i = 0; i < QUESTIONS.length; i++) {
      await page.fill("#input", QUESTIONS[i]);
      await page.keyboard.press("Enter");
      // A finished reply carries its meta line (TTFT, tokens/s).
      await page.waitForFunction((n) => document.querySelectorAll(
        ".msg.assistant .meta").length === n, i + 1, { timeout: 60000 });
      replies.push(await page.$$eval(".msg.assistant", (els) =>
        els[els.length - 1].firstChild.textContent));
    }
    const stats = await page.textContent("#stats");
    const metas = await page.$$eval(".msg.assistant .meta", (els) => els.map((e) => e.textContent));
    await page.screenshot({ path: screenshot });
    const users = await page.$$eval(".msg.user", (els) => els.map((e) => e.textContent));
    const stopped = await stopLongReply(page);
    console.log(JSON.stringify({ replies, stats, metas, users, stopped, usages, consoleErrors }));
  }, {
    viewport: { width: 1000, height: 640 },
    args: ["--disable-quic", "--disable-background-networking", "--disable-component-update",
           "--disable-sync"],
  });
}

// Ask for a long reply, press Stop once it streams; returns the reply's meta line.
async function stopLongReply(page) {
  await page.fill("#input", LONG_QUESTION);
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => {
    const el = document.querySelector(".msg.assistant.streaming");
    return el && el.textContent.length > 0;
  }, null, { timeout: 60000 });
  await page.click("#stop");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant .meta").length === 3,
    null, { timeout: 60000 });
  return page.$$eval(".msg.assistant .meta", (els) => els[els.length - 1].textContent);
}

main().catch((e) => { console.error(e); process.exit(1); });
