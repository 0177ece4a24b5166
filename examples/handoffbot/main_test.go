package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// The bot's unit tests with kfpipe's test kit; RunTwice runs a message
// again, as after a crash, and checks the bot replies the same way.

func TestWelcome(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	h.RunTwice(kfpipetest.EnterSession("u1", "", ""))
	if d := h.Delivered("u1"); len(d) != 1 || d[0] != welcome {
		t.Fatalf("delivered %q, want the welcome once", d)
	}
}

// TestPhotoHandsOver: a photo gets a thank-you, the customer goes to alice,
// and WeChat's event message about the hand-off (the msg_code) is sent
// once, however often the bot runs.
func TestPhotoHandsOver(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	first, second := h.RunTwice(kfpipetest.Image("u1", "media-1"))
	first.ExpectDone()
	rs := first.Replies
	if len(rs) != 3 || rs[0].Text() != thanks || rs[1].Kind != kfpipetest.KindTransfer || rs[1].Servicer != "alice" ||
		rs[2].Kind != kfpipetest.KindEventMessage {
		t.Fatalf("replies %v, want a thank-you, a transfer to alice and the event message", rs)
	}
	for _, r := range second.LastCall() {
		if r.Outcome != kfpipetest.Skipped {
			t.Fatalf("second run %v: every reply was already sent", second.LastCall())
		}
	}
	want := []string{thanks, fmt.Sprintf(handOver, "alice")}
	if d := h.Delivered("u1"); len(d) != 2 || d[0] != want[0] || d[1] != want[1] {
		t.Fatalf("delivered %q, want %q", d, want)
	}
	if h.SessionState("u1") != kf.StateServicer {
		t.Fatalf("state %d, want the servicer's", h.SessionState("u1"))
	}
}

// TestPhotoSize: the thank-you names the photo's size, read from the media
// store (kfpipe.OpenMedia) — also when the bot runs again after WeChat
// expired the media_id, since the photo was kept before the first run.
func TestPhotoSize(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	photo := append([]byte("\xff\xd8\xff\xe0"), make([]byte, 2996)...) // a 3,000-byte JPEG
	m := h.ImageWith("u1", photo)
	want := fmt.Sprintf(thanksSized, 3)
	if r := h.Run(m).ExpectDone(); len(r.Replies) == 0 || r.Replies[0].Text() != want {
		t.Fatalf("replies %v, want %q first", r.Replies, want)
	}
	h.ExpireMedia(m)
	if r := h.Run(m).ExpectDone(); len(r.Replies) == 0 || r.Replies[0].Text() != want || r.Replies[0].Outcome != kfpipetest.Skipped {
		t.Fatalf("run after expiry: replies %v, want %q again (skipped: already sent)", r.Replies, want)
	}
}

// TestQuietWhileHumanServes: after the hand-off the bot answers nothing
// until the servicer ends the session; then it answers again.
func TestQuietWhileHumanServes(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	h.Run(kfpipetest.Image("u1", "media-1")).ExpectDone()
	h.Run(kfpipetest.Text("u1", "hello? is anyone there?")).ExpectDone().ExpectNoReplies()
	h.Run(kfpipetest.ServicerText("u1", "alice", "Hi, I see the photo")).ExpectDone().ExpectNoReplies()
	h.Run(kfpipetest.SessionStatusChange("u1", 3, "alice", "")).ExpectDone().ExpectNoReplies()
	h.Run(kfpipetest.Text("u1", "thanks")).ExpectDone().ExpectTexts(help)
}

// TestReplyRefusedByHumanSessionIsSkipped: a servicer took the session at
// WeChat after the bot read the state (its event not handled yet): WeChat
// refuses the reply (95018) and the message is finished with the reply
// skipped, not dead-lettered.
func TestReplyRefusedByHumanSessionIsSkipped(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	h.Run(kfpipetest.Text("u1", "hi")).ExpectDone().ExpectTexts(help)
	h.SetSessionState("u1", kf.StateServicer, "bob") // no event yet: the cached state says bot
	r := h.Run(kfpipetest.Text("u1", "where is my parcel?")).ExpectDone()
	if len(r.Replies) != 1 || r.Replies[0].Outcome != kfpipetest.ServicerSession ||
		!errors.Is(r.Replies[0].Err, kfpipe.ErrServicerSession) {
		t.Fatalf("replies %v, want one skipped because a human serves", r.Replies)
	}
	if d := h.Delivered("u1"); len(d) != 1 {
		t.Fatalf("delivered %q: the refused reply reached the customer", d)
	}
}

// TestInjected95018: WeChat refuses the reply with 95018 (a servicer took
// the session this instant): the message is finished, not dead-lettered,
// and nothing reached the customer.
func TestInjected95018(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	h.FailNext(kfpipetest.APISendMsg, 1, kfpipetest.ErrcodeServicerSession)
	r := h.Run(kfpipetest.Text("u1", "where is my parcel?"))
	if rs := r.ExpectDone().Replies; len(rs) != 1 || rs[0].Outcome != kfpipetest.ServicerSession {
		t.Fatalf("replies %v, want one refused with 95018", rs)
	}
	if d := h.Delivered("u1"); len(d) != 0 {
		t.Fatalf("delivered %q, want nothing", d)
	}
}
