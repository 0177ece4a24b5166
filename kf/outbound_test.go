package kf_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kfpipe/kfpipe/kf"
)

// TestOutboundTypes: voice, video and file go out with an uploaded
// media_id (40007 without one), a ca_link with its link_url; each is
// delivered in WeChat's shape and read back by ParseMessage.
func TestOutboundTypes(t *testing.T) {
	fake, c, _ := setup(t)
	ctx := context.Background()
	fake.AddText("wk1", "u1", "send me things")
	for _, tc := range []struct {
		typ, media string
		msg        func(id string) kf.Message
	}{
		{"voice", kf.MediaVoice, func(id string) kf.Message { return kf.Voice{MediaID: id} }},
		{"video", kf.MediaVideo, func(id string) kf.Message { return kf.Video{MediaID: id} }},
		{"file", kf.MediaFile, func(id string) kf.Message { return kf.File{MediaID: id} }},
	} {
		if _, err := c.Send(ctx, "wk1", "u1", "", tc.msg("never-uploaded")); code(err) != kf.CodeInvalidMediaID {
			t.Fatalf("%s with a media_id never uploaded: %v, want 40007", tc.typ, err)
		}
		id, err := c.UploadMedia(ctx, tc.media, "x."+tc.typ, []byte("data of "+tc.typ))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Send(ctx, "wk1", "u1", "", tc.msg(id)); err != nil {
			t.Fatalf("%s: %v", tc.typ, err)
		}
		rs := fake.Replies("wk1", "u1")
		last := rs[len(rs)-1]
		if last.MsgType != tc.typ || !strings.Contains(string(last.Body), id) {
			t.Fatalf("delivered %s %s, want %s with %s", last.MsgType, last.Body, tc.typ, id)
		}
		doc, _ := json.Marshal(map[string]any{"msgtype": tc.typ, tc.typ: json.RawMessage(last.Body)})
		if _, err := kf.ParseMessage(doc); err != nil {
			t.Fatalf("ParseMessage(%s): %v", doc, err)
		}
	}
	// One message of the customer allows 5 messages: a new one for the
	// ca_link.
	fake.AddText("wk1", "u1", "and a link")
	if _, err := c.Send(ctx, "wk1", "u1", "", kf.CALink{LinkURL: "https://work.weixin.qq.com/ca/cawcde"}); err != nil {
		t.Fatal(err)
	}
	rs := fake.Replies("wk1", "u1")
	if last := rs[len(rs)-1]; last.MsgType != "ca_link" || !strings.Contains(string(last.Body), `"link_url":"https://work.weixin.qq.com/ca/cawcde"`) {
		t.Fatalf("delivered %s %s", last.MsgType, last.Body)
	}
	if _, err := c.Send(ctx, "wk1", "u1", "", kf.CALink{LinkURL: "ftp://x"}); code(err) != 40058 {
		t.Fatalf("ca_link without an https link: %v, want 40058", err)
	}
	if _, err := kf.ParseMessage([]byte(`{"msgtype":"ca_link","ca_link":{"link_url":"https://x"}}`)); err != nil {
		t.Fatal(err)
	}
	// A text over 2048 bytes is refused before the call, with the way out.
	long := kf.Text{Content: strings.Repeat("a", kf.MaxTextBytes+1)}
	if _, err := c.Send(ctx, "wk1", "u1", "", long); err == nil || !strings.Contains(err.Error(), "SplitText") {
		t.Fatalf("long text: %v", err)
	}
	// A text read from a webhook answer is a kf.Text, which
	// kfpipe.Reply splits.
	doc, _ := json.Marshal(map[string]any{"msgtype": "text", "text": map[string]any{"content": long.Content}})
	if m, err := kf.ParseMessage(doc); err != nil || m != kf.Message(long) {
		t.Fatalf("ParseMessage of a long text: %#v, %v", m, err)
	}
}

// TestSplitText: parts fit WeChat's limit with their number, are cut on
// UTF-8 boundaries (preferring a space or line break), put back together
// give the text; too many parts is an error.
func TestSplitText(t *testing.T) {
	if p, err := kf.SplitText("short", 5); err != nil || len(p) != 1 || p[0] != "short" {
		t.Fatalf("short: %q %v", p, err)
	}
	// 3-byte characters and words: a cut in the middle of a character
	// would be invalid UTF-8.
	text := strings.Repeat("客服消息 hello ", 400) // 400 × 19 bytes = 7600
	parts, err := kf.SplitText(text, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 4 {
		t.Fatalf("%d parts of a 7600-byte text, want 4", len(parts))
	}
	var joined strings.Builder
	for i, p := range parts {
		pre := "(" + string(rune('1'+i)) + "/4) "
		if len(p) > kf.MaxTextBytes || !utf8.ValidString(p) || !strings.HasPrefix(p, pre) {
			t.Fatalf("part %d: %d bytes, valid %v, prefix %q", i, len(p), utf8.ValidString(p), p[:8])
		}
		if i < len(parts)-1 && !strings.HasSuffix(p, " ") {
			t.Fatalf("part %d is not cut at a space: …%q", i, p[len(p)-10:])
		}
		joined.WriteString(strings.TrimPrefix(p, pre))
	}
	if joined.String() != text {
		t.Fatal("the parts put back together are not the text")
	}
	// No space at all: cut on character boundaries.
	parts, err = kf.SplitText(strings.Repeat("界", 1500), 5) // 4500 bytes
	if err != nil || len(parts) != 3 {
		t.Fatalf("%d parts, %v", len(parts), err)
	}
	for _, p := range parts {
		if !utf8.ValidString(p) || len(p) > kf.MaxTextBytes {
			t.Fatalf("part of %d bytes, valid %v", len(p), utf8.ValidString(p))
		}
	}
	if _, err := kf.SplitText(strings.Repeat("a", 5*kf.MaxTextBytes), 5); err == nil {
		t.Fatal("a text needing 6 parts was split into 5")
	}
	if _, err := kf.SplitText(strings.Repeat("a", 3*kf.MaxTextBytes), 2); err == nil {
		t.Fatal("a text needing 3 parts was split with 2 allowed")
	}
}
