package kf

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Voice is a voice message (an AMR file uploaded with UploadMedia,
// MediaVoice).
type Voice struct {
	MediaID string
}

// Video is a video (an MP4 file uploaded with UploadMedia, MediaVideo).
type Video struct {
	MediaID string
}

// File is a file (uploaded with UploadMedia, MediaFile).
type File struct {
	MediaID string
}

// CALink is a customer-acquisition link (获客链接) card: LinkURL is a link
// made in the WeCom admin console's customer-acquisition assistant.
type CALink struct {
	LinkURL string
}

func (Voice) msgType() string  { return "voice" }
func (Video) msgType() string  { return "video" }
func (File) msgType() string   { return "file" }
func (CALink) msgType() string { return "ca_link" }

func (m Voice) body() map[string]any {
	return map[string]any{"msgtype": "voice", "voice": map[string]any{"media_id": m.MediaID}}
}

func (m Video) body() map[string]any {
	return map[string]any{"msgtype": "video", "video": map[string]any{"media_id": m.MediaID}}
}

func (m File) body() map[string]any {
	return map[string]any{"msgtype": "file", "file": map[string]any{"media_id": m.MediaID}}
}

func (m CALink) body() map[string]any {
	return map[string]any{"msgtype": "ca_link", "ca_link": map[string]any{"link_url": m.LinkURL}}
}

// MaxTextBytes is the most bytes of UTF-8 a text message may hold: WeChat
// refuses a longer one (45002). SplitText cuts a longer text into parts.
const MaxTextBytes = 2048

// MaxRepliesPerMessage is how many messages WeChat lets a handler send
// after each message of the customer (95001 afterwards, until the
// customer writes again).
const MaxRepliesPerMessage = 5

// CodeContentTooLong is WeChat's errcode for a text longer than
// MaxTextBytes.
const CodeContentTooLong = 45002

// checkText refuses a text WeChat would refuse for its length, with a
// clear error before the call.
func checkText(m Message) error {
	if t, ok := m.(Text); ok && len(t.Content) > MaxTextBytes {
		return fmt.Errorf("kf: a text message holds at most %d bytes, this one %d: split it with kf.SplitText (kfpipe.Reply does)",
			MaxTextBytes, len(t.Content))
	}
	return nil
}

// SplitText cuts text into parts of at most MaxTextBytes each, numbered
// "(1/3) ", "(2/3) ", … (the number counts in the limit), cut on UTF-8
// character boundaries, at the last line break or space of a part when
// one is in its last quarter. A text that fits is one part, unnumbered.
// More than maxParts parts is an error: WeChat takes at most
// MaxRepliesPerMessage messages per customer message, and a text cut
// short would read as a complete answer.
func SplitText(text string, maxParts int) ([]string, error) {
	if len(text) <= MaxTextBytes {
		return []string{text}, nil
	}
	if !utf8.ValidString(text) {
		return nil, fmt.Errorf("kf: the text is not valid UTF-8")
	}
	// The prefix's length depends on the count; try counts until the
	// parts fit the count they were cut for.
	for n := 2; n <= maxParts; n++ {
		parts := cut(text, MaxTextBytes-len(prefix(n, n)), n)
		if len(parts) <= n {
			out := make([]string, len(parts))
			for i, p := range parts {
				out[i] = prefix(i+1, len(parts)) + p
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("kf: the text is %d bytes: more than %d messages of %d bytes, the most WeChat takes after one message of the customer",
		len(text), maxParts, MaxTextBytes)
}

func prefix(i, n int) string { return "(" + strconv.Itoa(i) + "/" + strconv.Itoa(n) + ") " }

// cut cuts text into parts of at most size bytes; it stops after limit+1
// parts (too many already).
func cut(text string, size, limit int) []string {
	var parts []string
	for len(text) > 0 && len(parts) <= limit {
		if len(text) <= size {
			parts = append(parts, text)
			break
		}
		end := size
		for end > 0 && !utf8.RuneStart(text[end]) {
			end--
		}
		if i := strings.LastIndexAny(text[:end], "\n "); i >= end-end/4 && i > 0 {
			end = i + 1
		}
		parts = append(parts, text[:end])
		text = text[end:]
	}
	return parts
}
