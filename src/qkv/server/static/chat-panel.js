// qkv playground: the chat panel. Shown when the server offers POST /v1/chat/completions and has a chat template
// to render with (GET /v1/model's endpoints and chat_template). Each turn sends the whole conversation (the system
// prompt first, when there is one) and streams the answer's deltas (OpenAI's chat.completion.chunk events) into the
// log. /reset forgets the conversation and keeps the system prompt. Loaded before app.js, whose helpers ($, state,
// readEvents) it uses when called; app.js calls showChat once it knows the model.
"use strict";

const chat = { messages: [], controller: null };

/** Show the panel for a model that can chat; the rest of the page stays as it is. */
function showChat(info) {
  const can = info.endpoints.includes("/v1/chat/completions") && Boolean(info.chat_template);
  $("chat-section").hidden = !can;
  if (can) {
    $("chat-max-tokens").max = info.limits.max_tokens;
    showChatTemperature();
  }
}

function showChatTemperature() {
  const t = Number($("chat-temperature").value);
  $("chat-temperature-value").textContent = t === 0 ? "0 (greedy)" : t.toFixed(2);
}

/** One turn in the log: the role's name above the text. */
function chatTurn(role, text) {
  const turn = document.createElement("div");
  turn.className = `chat-turn ${role}`;
  turn.append(Object.assign(document.createElement("span"), { className: "chat-role", textContent: role }));
  const body = Object.assign(document.createElement("span"), { className: "chat-text", textContent: text });
  turn.append(body);
  $("chat-log").append(turn);
  $("chat-log").dataset.turns = String($("chat-log").children.length);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return body;
}

function setChatRunning(running) {
  $("chat-send").disabled = running;
  $("chat-input").disabled = running;
  $("chat-stop").disabled = !running;
  $("chat-log").dataset.state = running ? "running" : "idle";
}

function resetChat() {
  chat.messages = [];
  $("chat-log").replaceChildren();
  $("chat-log").dataset.turns = "0";
  $("chat-status").textContent = "The conversation is forgotten; the system prompt stays.";
}

async function sendChat(event) {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text) return;
  if (text === "/reset") {
    $("chat-input").value = "";
    return resetChat();
  }
  const most = $("chat-max-tokens");
  if (!most.checkValidity()) {  // kept in the box, to send again
    $("chat-status").textContent = `Tokens at most must be a whole number from ${most.min} to ${most.max}.`;
    return;
  }
  $("chat-input").value = "";
  chatTurn("user", text);
  chat.messages.push({ role: "user", content: text });
  const system = $("chat-system").value.trim();
  const body = {
    messages: [...(system ? [{ role: "system", content: system }] : []), ...chat.messages],
    temperature: Number($("chat-temperature").value),
    max_completion_tokens: Number($("chat-max-tokens").value),
    stream: true,
    stream_options: { include_usage: true },
  };
  const answer = chatTurn("assistant", "");
  answer.parentElement.dataset.state = "running";
  chat.controller = new AbortController();
  setChatRunning(true);
  $("chat-status").textContent = "Answering…";
  const started = performance.now();
  let finish = null, usage = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: chat.controller.signal,
    });
    if (!response.ok) {
      const data = await response.json().catch(() => ({}));
      throw new Error((data.error && data.error.message) || `HTTP ${response.status}`);
    }
    await readEvents(response, (payload) => {
      if (payload === "[DONE]") return;
      const data = JSON.parse(payload);
      if (data.error) throw new Error(data.error.message);
      if (data.usage) usage = data.usage;
      const choice = data.choices[0];
      if (!choice) return;
      if (choice.delta && choice.delta.content) answer.textContent += choice.delta.content;
      if (choice.finish_reason) finish = choice.finish_reason;
    });
    chat.messages.push({ role: "assistant", content: answer.textContent });
    answer.parentElement.dataset.state = "done";
    const seconds = (performance.now() - started) / 1000;
    const n = usage ? usage.completion_tokens : 0;
    $("chat-status").textContent = `${n} tokens in ${seconds.toFixed(2)} s; `
      + (finish === "stop" ? "the answer ended its turn." : "it reached the token limit.")
      + (usage ? ` The conversation is ${usage.prompt_tokens} tokens long.` : "");
  } catch (error) {
    if (error.name === "AbortError") {  // what was said so far stays in the conversation
      chat.messages.push({ role: "assistant", content: answer.textContent });
      answer.parentElement.dataset.state = "stopped";
      $("chat-status").textContent = "Stopped.";
    } else {  // the turn did not happen: the message leaves the history, and the log says why
      chat.messages.pop();
      answer.parentElement.dataset.state = "error";
      answer.textContent = error.message;
      $("chat-status").textContent = "The message was not answered; it is not part of the conversation.";
    }
  } finally {
    chat.controller = null;
    setChatRunning(false);
    $("chat-input").focus();
  }
}

function wireChat() {
  $("chat-form").addEventListener("submit", sendChat);
  $("chat-stop").addEventListener("click", () => chat.controller && chat.controller.abort());
  $("chat-temperature").addEventListener("input", showChatTemperature);
}
