"""A scripted OpenAI-compatible server for collection tests, with fault injection.

Agent (/v1/completions, a Llama-3.1-templated prompt): on its first turn it asks a question (frontend: gives a draft
page); on its second it answers with the task's ground truth when the task's line number is even, and with a wrong
function (frontend: a plain page) when it is odd.
Simulator (/v1/chat/completions): a fixed 600-character reply (so the 400-character cut shows).
Faults: a `fault_rate` share of requests gets, in turn, a 500, a reply slower than the client's timeout, or a
connection closed without a reply.
"""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USER_HEADER = "<|start_header_id|>user<|end_header_id|>\n\n"
SIMULATOR_REPLY = "I am not sure about that detail; please keep it simple. " * 11  # 616 characters
WRONG_ANSWER = "I WANT TO ANSWER:\ndef solution(*args, **kwargs):\n    return 'wrong'\n"
QUESTION = "What should the function return when the input is empty?"
DRAFT_PAGE = "A first draft. OUTPUT: <html><body><h1>Draft</h1></body></html>"
PLAIN_PAGE = "<html><body><p>plain</p></body></html>"


class FakeOpenAI:
    def __init__(self, tasks: list[dict], fault_rate: float = 0.0, slow_s: float = 3.0, seed: int = 0,
                 frontend: bool = False, chat_reply=None, port: int = 0, delay_s: float = 0.0):
        self.frontend = frontend
        self.chat_reply = chat_reply  # body -> reply text, instead of the simulator's fixed reply
        self.chat_images: list[int] = []  # image parts per simulator request
        self.asked: dict[int, int] = {}  # agent requests per task (its line number)
        self.by_description = {t["problem_description"].strip(): (i, t) for i, t in enumerate(tasks)}
        self.fault_rate = fault_rate
        self.slow_s = slow_s
        self.delay_s = delay_s  # every reply waits this long (a server with work to do)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "500": 0, "slow": 0, "drop": 0}
        self._kinds = ["500", "slow", "drop"]
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server.lock:
                    server.counts["requests"] += 1
                    fault = None
                    if server.rng.random() < server.fault_rate:
                        fault = server._kinds[server.counts["requests"] % 3]
                        server.counts[fault] += 1
                if fault == "500":
                    return self._send(500, {"error": {"message": "injected server error", "type": "server_error"}})
                if fault == "drop":
                    self.close_connection = True
                    return  # no response at all: the client sees the connection drop
                if fault == "slow":
                    time.sleep(server.slow_s)
                time.sleep(server.delay_s)
                if self.path.endswith("/completions") and "chat" not in self.path:
                    text = server.agent(body["prompt"])
                    return self._send(200, {"id": "c", "object": "text_completion", "created": 0,
                                            "model": body.get("model", ""), "choices": [
                                                {"index": 0, "text": text, "finish_reason": "stop",
                                                 "logprobs": None}]})
                content = body["messages"][-1]["content"]
                with server.lock:
                    server.chat_images.append(sum(isinstance(p, dict) and p.get("type") == "image_url" and
                                                  p["image_url"]["url"].startswith("data:image/png;base64,")
                                                  for p in (content if isinstance(content, list) else [])))
                reply = server.chat_reply(body) if server.chat_reply else SIMULATOR_REPLY
                return self._send(200, {"id": "c", "object": "chat.completion", "created": 0,
                                        "model": body.get("model", ""), "choices": [
                                            {"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant", "content": reply}}]})

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def agent(self, prompt: str) -> str:
        first_user = prompt.split(USER_HEADER, 1)[1].split("<|eot_id|>", 1)[0].strip()
        index, task = self.by_description[first_user]
        with self.lock:
            self.asked[index] = self.asked.get(index, 0) + 1
        if prompt.count(USER_HEADER) == 1:
            return DRAFT_PAGE if self.frontend else QUESTION
        if self.frontend:
            return "Done. OUTPUT: I WANT TO ANSWER: " + (task["ground_truth"] if index % 2 == 0 else PLAIN_PAGE)
        if index % 2 == 0:
            return f"I WANT TO ANSWER:\n```python\n{task['ground_truth']}\n```"
        return WRONG_ANSWER

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()



if __name__ == "__main__":  # a server process, for tests that kill it: fake_openai.py PORT TASKS LIMIT DELAY_S
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from sweet_jax.colbench.task_sets import load_tasks

    port, tasks, limit, delay = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    FakeOpenAI(load_tasks(tasks, "backend", limit=limit), port=port, delay_s=delay).httpd.serve_forever()
