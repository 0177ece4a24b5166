// Command llmbot is a customer-service bot that answers with a large
// language model, written against kfpipe's public API only. It calls an
// OpenAI-compatible chat-completions endpoint with the customer's
// conversation so far (kfpipe.History: the customer's earlier messages and
// the human servicers') as context, and keeps the model's answer with the
// message (kfpipe.Memo), so a message handled again — a retry, a crash, a
// rebalance, a DLQ recovery days later — is answered with the same words
// and the model is not asked twice. While a human serves the customer, the
// bot stays quiet.
//
//	llmbot --config config.yaml   a schedule-consumer with the bot as its handler
//	llmbot --simulate             chat with it on http://127.0.0.1:8095/
//
// The endpoint and the model come from the environment:
//
//	LLMBOT_BASE_URL   the API's base URL (default https://api.openai.com/v1;
//	                  any OpenAI-compatible server: vLLM, Ollama, a gateway)
//	LLMBOT_API_KEY    its bearer key (OPENAI_API_KEY when unset)
//	LLMBOT_MODEL      the model (default gpt-4o-mini)
//	LLMBOT_TURNS      how many earlier turns go with the question (default 20)
//	LLMBOT_TIMEOUT    the longest a model's answer may take (default 45s; keep
//	                  it below processor.attempt_timeout: README.md)
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kfpipesim"
)

func main() {
	cfg, err := configFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmbot:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	chat := &Client{BaseURL: cfg.baseURL, APIKey: cfg.apiKey, Model: cfg.model,
		HTTP: &http.Client{Timeout: cfg.timeout}}
	h := kfpipe.Chain(Bot(chat, cfg.turns), kfpipe.Logging(func(m *kfpipe.Message, err error, took time.Duration) {
		if err != nil {
			log.Printf("message %s of %s: %v (%s)", m.UpstreamMsgID, m.ExternalUserID, err, took)
		}
	}))
	err = kfpipesim.Main(ctx, os.Args[1:], h)
	if err != nil && (ctx.Err() == nil || !errors.Is(err, context.Canceled)) {
		fmt.Fprintln(os.Stderr, "llmbot:", err)
		os.Exit(1)
	}
}

// config is the bot's settings, from the environment.
type config struct {
	baseURL, apiKey, model string
	turns                  int
	timeout                time.Duration
}

func configFromEnv(getenv func(string) string) (config, error) {
	c := config{baseURL: getenv("LLMBOT_BASE_URL"), apiKey: getenv("LLMBOT_API_KEY"), model: getenv("LLMBOT_MODEL"),
		turns: 20, timeout: 45 * time.Second}
	if c.baseURL == "" {
		c.baseURL = "https://api.openai.com/v1"
	}
	if c.apiKey == "" {
		c.apiKey = getenv("OPENAI_API_KEY")
	}
	if c.model == "" {
		c.model = "gpt-4o-mini"
	}
	if v := getenv("LLMBOT_TURNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 200 {
			return c, fmt.Errorf("LLMBOT_TURNS=%q: want a number of turns in [0, 200]", v)
		}
		c.turns = n
	}
	if v := getenv("LLMBOT_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("LLMBOT_TIMEOUT=%q: want a duration such as 45s", v)
		}
		c.timeout = d
	}
	return c, nil
}
