package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kfpipe/kfpipe"
)

// Client calls an OpenAI-compatible chat-completions endpoint
// (POST {BaseURL}/chat/completions).
type Client struct {
	BaseURL string
	APIKey  string
	Model   string
	HTTP    *http.Client
}

// ChatMessage is one message of a chat-completions request.
type ChatMessage struct {
	Role    string `json:"role"` // system, user or assistant
	Content string `json:"content"`
}

type chatRequest struct {
	Model    string        `json:"model"`
	Messages []ChatMessage `json:"messages"`
}

type chatResponse struct {
	Choices []struct {
		Message ChatMessage `json:"message"`
	} `json:"choices"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Complete asks the model for the next assistant message. A refusal the
// same request would meet again (400: the request itself is wrong) is
// kfpipe.Permanent; anything else (401 while a key is rotated, 429, 5xx,
// the network, the context's deadline) is an error the consumer retries,
// then dead-letters as recoverable, so the DLQ brings the message back
// once the model answers again.
func (c *Client) Complete(ctx context.Context, msgs []ChatMessage) (string, error) {
	body, err := json.Marshal(chatRequest{Model: c.Model, Messages: msgs})
	if err != nil {
		return "", kfpipe.Permanent(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", kfpipe.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("chat completion: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("chat completion: reading the answer: %w", err)
	}
	var cr chatResponse
	jerr := json.Unmarshal(data, &cr)
	if resp.StatusCode != http.StatusOK {
		why := strings.TrimSpace(string(data))
		if jerr == nil && cr.Error != nil {
			why = cr.Error.Message
		}
		err := fmt.Errorf("chat completion: %s: %.200s", resp.Status, why)
		if resp.StatusCode == http.StatusBadRequest {
			return "", kfpipe.Permanent(err)
		}
		return "", err
	}
	if jerr != nil {
		return "", fmt.Errorf("chat completion: the answer is not JSON: %w", jerr)
	}
	if len(cr.Choices) == 0 || strings.TrimSpace(cr.Choices[0].Message.Content) == "" {
		return "", fmt.Errorf("chat completion: the answer has no message")
	}
	return cr.Choices[0].Message.Content, nil
}
