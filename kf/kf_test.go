package kf_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/testenv"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
	"github.com/kfpipe/kfpipe/kf"
)

func setup(t *testing.T) (*wecomtest.Server, *kf.Client, *testenv.Clock) {
	t.Helper()
	clk := testenv.NewClock(time.Now())
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wk1"}, Clock: clk.Now, TokenTTL: 1000 * time.Hour})
	t.Cleanup(fake.Close)
	c, err := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	if err != nil {
		t.Fatal(err)
	}
	return fake, c, clk
}

func code(err error) int {
	var e *kf.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// TestReplyWindow: after a customer's message at most 5 messages go out
// (95001, permanent), a new message of the customer opens the window
// again, and 48 hours after the customer's last message nothing goes out
// (95002).
func TestReplyWindow(t *testing.T) {
	fake, c, clk := setup(t)
	ctx := context.Background()
	if _, err := c.Send(ctx, "wk1", "u1", "", kf.Text{Content: "hi"}); code(err) != kf.CodeInvalidUser {
		t.Fatalf("send to a customer who never wrote: %v", err)
	}
	fake.AddText("wk1", "u1", "hello")
	for i := range 5 {
		if _, err := c.Send(ctx, "wk1", "u1", "", kf.Text{Content: fmt.Sprint(i)}); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
	}
	_, err := c.Send(ctx, "wk1", "u1", "", kf.Text{Content: "6th"})
	if code(err) != kf.CodeReplyLimit || !kf.IsPermanent(err) {
		t.Fatalf("6th reply: %v, want permanent 95001", err)
	}
	fake.AddText("wk1", "u1", "again")
	if _, err := c.Send(ctx, "wk1", "u1", "", kf.Text{Content: "ok"}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(48*time.Hour + time.Second)
	if _, err := c.Send(ctx, "wk1", "u1", "", kf.Text{Content: "late"}); code(err) != kf.CodeReplyWindowClosed {
		t.Fatalf("after 48 h: %v, want 95002", err)
	}
	if n := len(fake.Replies("wk1", "u1")); n != 6 {
		t.Fatalf("%d replies delivered, want 6", n)
	}
	// The fake keeps WeChat's refusals, for a test's checker to tell a
	// routine refusal from a reply lost.
	rf := fake.Refusals()
	if len(rf) != 2 || rf[0].Errcode != kf.CodeReplyLimit || rf[0].User != "u1" || !strings.Contains(string(rf[0].Body), "6th") ||
		rf[1].Errcode != kf.CodeReplyWindowClosed {
		t.Fatalf("refusals %+v, want the 6th reply's 95001 and the late one's 95002", rf)
	}
}

// TestSessionStatesAndWelcome: the bot hands the customer to a servicer,
// an invalid change is refused (95016), an ended session takes no message
// (95013); a welcome_code serves once.
func TestSessionStatesAndWelcome(t *testing.T) {
	fake, c, _ := setup(t)
	ctx := context.Background()
	fake.AddEvent("wk1", "u2", "enter_session")
	code0 := welcomeCode(t, fake)
	if _, err := c.SendOnEvent(ctx, code0, "", kf.Text{Content: "welcome"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SendOnEvent(ctx, code0, "", kf.Text{Content: "again"}); code(err) != kf.CodeWelcomeCodeUsed {
		t.Fatalf("second use of a welcome_code: %v", err)
	}
	fake.AddText("wk1", "u2", "human please")
	msgCode, err := c.TransServiceState(ctx, "wk1", "u2", kf.StateServicer, "alice")
	if err != nil || msgCode == "" {
		t.Fatalf("transfer: msg_code %q, %v", msgCode, err)
	}
	if st, who, err := c.ServiceState(ctx, "wk1", "u2"); err != nil || st != kf.StateServicer || who != "alice" {
		t.Fatalf("state %v %q %v", st, who, err)
	}
	// While alice holds the session the API may not talk over her (95018);
	// the message of the hand-off goes with its msg_code, once.
	if _, err := c.Send(ctx, "wk1", "u2", "", kf.Text{Content: "bot here"}); code(err) != kf.CodeSessionInvalid || !kf.IsPermanent(err) {
		t.Fatalf("send while a servicer holds the session: %v, want 95018", err)
	}
	if _, err := c.SendOnEvent(ctx, msgCode, "", kf.Text{Content: "alice will help"}); err != nil {
		t.Fatalf("event message with the msg_code: %v", err)
	}
	if _, err := c.SendOnEvent(ctx, msgCode, "", kf.Text{Content: "again"}); code(err) != kf.CodeWelcomeCodeUsed {
		t.Fatalf("second use of a msg_code: %v, want 95017", err)
	}
	if _, err := c.TransServiceState(ctx, "wk1", "u2", kf.StateBot, ""); code(err) != kf.CodeInvalidTransition {
		t.Fatalf("servicer → bot: %v, want 95016", err)
	}
	if _, err := c.TransServiceState(ctx, "wk1", "u2", kf.StateEnded, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(ctx, "wk1", "u2", "", kf.Text{Content: "bye"}); code(err) != kf.CodeSessionEnded {
		t.Fatalf("send after the end: %v, want 95013", err)
	}
}

func welcomeCode(t *testing.T, fake *wecomtest.Server) string {
	t.Helper()
	msgs := fake.Messages("wk1")
	m := regexp.MustCompile(`"welcome_code":"([0-9a-f]+)"`).FindSubmatch(msgs[len(msgs)-1].Content)
	if m == nil {
		t.Fatalf("no welcome_code in %s", msgs[len(msgs)-1].Content)
	}
	return string(m[1])
}

// TestRetryableAndMsgID: -1 and 45009 are retried by the client; a given
// msgid is kept and a repeat of it is not delivered again by the fake.
func TestRetryableAndMsgID(t *testing.T) {
	fake, c, _ := setup(t)
	ctx := context.Background()
	fake.AddText("wk1", "u3", "hi")
	fake.FailNextSend(2, kf.CodeFrequencyLimit)
	id := kf.MsgID("wk1", "up-1", 0)
	if got, err := c.Send(ctx, "wk1", "u3", id, kf.Menu{HeadContent: "pick", Items: []kf.MenuItem{{ID: "1", Content: "one"}}}); err != nil || got != id {
		t.Fatalf("send after 45009 twice: %q %v", got, err)
	}
	if _, err := c.Send(ctx, "wk1", "u3", id, kf.Text{Content: "dup"}); err != nil {
		t.Fatal(err)
	}
	if n, d := len(fake.Replies("wk1", "u3")), fake.DuplicateMsgIDs(); n != 1 || d != 1 {
		t.Fatalf("replies %d duplicates %d, want 1 and 1", n, d)
	}
	if !regexp.MustCompile(`^[0-9A-Za-z_-]{32}$`).MatchString(id) || kf.MsgID("wk1", "up-1", 1) == id {
		t.Fatalf("MsgID %q", id)
	}
	if _, err := c.Send(ctx, "wk1", "u3", "not/valid", kf.Text{Content: "x"}); err == nil {
		t.Fatal("an invalid msgid was accepted")
	}
}

// ExampleClient_Send replies to a customer of the fake WeChat.
func ExampleClient_Send() {
	fake := wecomtest.New(wecomtest.Options{Accounts: []string{"wkShop"}})
	defer fake.Close()
	fake.AddText("wkShop", "wmCustomer", "opening hours?")

	c, _ := kf.New(kf.Config{BaseURL: fake.URL(), CorpID: fake.CorpID(), Secret: fake.Secret()})
	_, err := c.Send(context.Background(), "wkShop", "wmCustomer", kf.MsgID("wkShop", "msg-1", 0),
		kf.Text{Content: "We are open 9:00-18:00."})
	fmt.Println(err, len(fake.Replies("wkShop", "wmCustomer")))
	// Output: <nil> 1
}

// TestCustomersAndMedia: customer/batchget splits long lists and reports
// unknown ids; an image goes out only with a media_id uploaded before
// (40007 otherwise), and the upload's type and size are checked.
func TestCustomersAndMedia(t *testing.T) {
	fake, c, _ := setup(t)
	ctx := context.Background()
	fake.AddText("wk1", "u4", "hi")
	users := []string{"u4"}
	for i := range 150 {
		users = append(users, fmt.Sprintf("nobody-%d", i))
	}
	found, invalid, err := c.Customers(ctx, users)
	if err != nil || len(found) != 1 || found[0].ExternalUserID != "u4" || found[0].Nickname == "" || len(invalid) != 150 {
		t.Fatalf("Customers: %+v, %d invalid, %v", found, len(invalid), err)
	}
	if _, err := c.Send(ctx, "wk1", "u4", "", kf.Image{MediaID: "never-uploaded"}); code(err) != kf.CodeInvalidMediaID || !kf.IsPermanent(err) {
		t.Fatalf("image with an unknown media_id: %v, want permanent 40007", err)
	}
	id, err := c.UploadMedia(ctx, kf.MediaImage, "logo.png", []byte("\x89PNG fake"))
	if err != nil || id == "" {
		t.Fatalf("upload: %q %v", id, err)
	}
	if _, err := c.Send(ctx, "wk1", "u4", "", kf.Image{MediaID: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UploadMedia(ctx, "gif", "x.gif", []byte("x")); code(err) != 40004 {
		t.Fatalf("upload of an unknown type: %v, want 40004", err)
	}
	if _, err := c.UploadMedia(ctx, kf.MediaVoice, "big.amr", make([]byte, 3<<20)); code(err) != 40006 {
		t.Fatalf("3 MB voice: %v, want 40006", err)
	}
	if rs := fake.Replies("wk1", "u4"); len(rs) != 1 || rs[0].MsgType != "image" {
		t.Fatalf("replies %+v", rs)
	}
}

// TestParseMessage: a webhook's reply in send_msg's shape is sent as is;
// what cannot be sent is refused with the reason.
func TestParseMessage(t *testing.T) {
	fake, c, _ := setup(t)
	ctx := context.Background()
	fake.AddText("wk1", "u5", "hi")
	m, err := kf.ParseMessage([]byte(`{"msgtype":"msgmenu","msgmenu":{"head_content":"pick","list":[{"type":"click","click":{"id":"1","content":"one"}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(ctx, "wk1", "u5", "", m); err != nil {
		t.Fatal(err)
	}
	if rs := fake.Replies("wk1", "u5"); len(rs) != 1 || rs[0].MsgType != "msgmenu" || !regexp.MustCompile(`"head_content":"pick"`).Match(rs[0].Body) {
		t.Fatalf("replies %+v", rs)
	}
	for _, bad := range []string{`[]`, `{"text":{"content":"x"}}`, `{"msgtype":"event","event":{"event_type":"x"}}`, `{"msgtype":"voice","voice":{}}`,
		`{"msgtype":"ca_link","ca_link":{}}`,
		`{"msgtype":"text"}`, `{"msgtype":"text","text":"x"}`} {
		if _, err := kf.ParseMessage([]byte(bad)); err == nil {
			t.Errorf("ParseMessage(%s) accepted", bad)
		}
	}
}

// TestServicerTakesAndEnds: a servicer taking and ending a session from
// the WeCom client changes its state and appends the session_status_change
// events WeChat sends, with a msg_code for the event message.
func TestServicerTakesAndEnds(t *testing.T) {
	fake, c, _ := setup(t)
	ctx := context.Background()
	fake.AddText("wk1", "u3", "hi")
	fake.ServicerTakes("wk1", "u3", "bob")
	msgs := fake.Messages("wk1")
	raw := string(msgs[len(msgs)-1].Content)
	m := regexp.MustCompile(`"msg_code":"([0-9a-f]+)"`).FindStringSubmatch(raw)
	if !strings.Contains(raw, `"event_type":"session_status_change"`) || !strings.Contains(raw, `"change_type":1`) || m == nil {
		t.Fatalf("event %s", raw)
	}
	if st, who, err := c.ServiceState(ctx, "wk1", "u3"); err != nil || st != kf.StateServicer || who != "bob" {
		t.Fatalf("state %v %q %v", st, who, err)
	}
	if _, err := c.SendOnEvent(ctx, m[1], "", kf.Text{Content: "bob is here"}); err != nil {
		t.Fatal(err)
	}
	fake.ServicerEnds("wk1", "u3")
	msgs = fake.Messages("wk1")
	if raw := string(msgs[len(msgs)-1].Content); !strings.Contains(raw, `"change_type":3`) {
		t.Fatalf("end event %s", raw)
	}
	if st, _, _ := c.ServiceState(ctx, "wk1", "u3"); st != kf.StateEnded {
		t.Fatalf("state %v after the end", st)
	}
}
