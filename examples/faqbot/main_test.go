package main

import (
	"testing"

	"github.com/kfpipe/kfpipe"
	"github.com/kfpipe/kfpipe/kf"
	"github.com/kfpipe/kfpipe/kfpipetest"
)

// The bot's unit tests, with kfpipe's test kit: each message runs twice
// (RunTwice), as after a crash, and must reply the same way both times.

func TestWelcomesOnEnterSession(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	first, _ := h.RunTwice(kfpipetest.EnterSession("u1", "ad", ""))
	first.ExpectDone()
	if rs := first.Replies; len(rs) != 1 || rs[0].Kind != kfpipetest.KindWelcome || rs[0].Outcome != kfpipetest.Sent {
		t.Fatalf("replies %v, want one welcome message sent", rs)
	}
	if d := h.Delivered("u1"); len(d) != 1 {
		t.Fatalf("delivered %q, want the welcome once", d)
	}
}

func TestAnswersFAQ(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	first, _ := h.RunTwice(kfpipetest.Text("u1", " Hours "))
	first.ExpectDone().ExpectTexts(faq["hours"])
}

func TestMenuAndTap(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	r, _ := h.RunTwice(kfpipetest.Text("u1", "menu"))
	if rs := r.ExpectDone().Replies; len(rs) != 1 || rs[0].Message.(kf.Menu).HeadContent != menu.HeadContent {
		t.Fatalf("replies %v, want the menu", rs)
	}
	h.Run(kfpipetest.MenuClick("u1", "shipping", "Shipping")).ExpectDone().ExpectTexts(faq["shipping"])
}

func TestHandsOverToAHuman(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	r, _ := h.RunTwice(kfpipetest.Text("u1", "human"))
	rs := r.ExpectDone().Replies
	if len(rs) != 2 || rs[1].Kind != kfpipetest.KindTransfer || rs[1].Servicer != "alice" {
		t.Fatalf("replies %v, want a text then a transfer to alice", rs)
	}
	if s := h.SessionState("u1"); s != kf.StateServicer {
		t.Fatalf("session state %d, want %d (with a servicer)", s, kf.StateServicer)
	}
}

func TestEchoesOtherTextAndExplainsOtherTypes(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	h.RunTwice(kfpipetest.Text("u1", "is it raining?"))
	h.RunTwice(kfpipetest.Location("u1", "Shop", "Main St 1", 31.2, 121.4))
	want := []string{"You said: is it raining?", "Sorry, I can only read text."}
	if d := h.Delivered("u1"); len(d) != 2 || d[0] != want[0] || d[1] != want[1] {
		t.Fatalf("delivered %q, want %q", d, want)
	}
}

// TestIgnoresNonCustomerMessages: a servicer's own message and events
// other than enter_session get no reply.
func TestIgnoresNonCustomerMessages(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	h.Run(kfpipetest.Text("u1", "hi")).ExpectDone()
	for _, m := range []*kfpipe.Message{
		kfpipetest.ServicerText("u1", "alice", "Hi, I am Alice from support"),
		kfpipetest.SessionStatusChange("u1", 1, "", "alice"),
		kfpipetest.UserRecallMsg("u1", "some-msgid"),
		kfpipetest.ServicerStatusChange("alice", 1),
	} {
		h.Run(m).ExpectDone().ExpectNoReplies()
	}
	if d := h.Delivered("u1"); len(d) != 1 {
		t.Fatalf("delivered %q, want the answer to the customer's message only", d)
	}
}

// TestPictureSize: a picture is answered with its size, the same on a
// re-run.
func TestPictureSize(t *testing.T) {
	h := kfpipetest.New(t, bot("alice"))
	photo := append([]byte("\xff\xd8\xff\xe0"), make([]byte, 5000)...)
	r, _ := h.RunTwice(h.ImageWith("u1", photo))
	r.ExpectDone().ExpectTexts("Thanks for the picture (5 KB).")
}
