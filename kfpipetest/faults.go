package kfpipetest

import "github.com/kfpipe/kfpipe/internal/wecom/wecomtest"

// WeChat's APIs whose answers FailNext injects (the path after /cgi-bin/).
const (
	// APISendMsg is kf/send_msg: kfpipe.Reply.
	APISendMsg = wecomtest.APISendMsg
	// APISendMsgOnEvent is kf/send_msg_on_event: kfpipe.Welcome and
	// kfpipe.SendEventMessage.
	APISendMsgOnEvent = wecomtest.APISendMsgOnEvent
	// APITransfer is kf/service_state/trans: kfpipe.Transfer.
	APITransfer = wecomtest.APITransfer
	// APIServiceState is kf/service_state/get: kfpipe.SessionState when
	// the state is not cached.
	APIServiceState = wecomtest.APIServiceState
	// APIMediaUpload is media/upload: kf.Client.UploadMedia.
	APIMediaUpload = wecomtest.APIMediaUpload
	// APIMediaGet is media/get: the download of a customer's media, which
	// Run makes before the handler runs (a failure fails the attempt, as
	// in the consumer).
	APIMediaGet = wecomtest.APIMediaGet
	// APIAny is any of WeChat's APIs but gettoken.
	APIAny = wecomtest.APIAny
)

// WeChat's errcodes a test injects most (any errcode may be).
const (
	// ErrcodeBusy (-1, system busy) is retryable: the kf client retries it
	// a few times within a call; more failures than that fail the attempt,
	// and the message is retried.
	ErrcodeBusy = -1
	// ErrcodeInvalidToken (40014): the client fetches a new access token
	// and calls again, once.
	ErrcodeInvalidToken = 40014
	// ErrcodeFrequencyLimit (45009) is retryable, with backoff, like -1.
	ErrcodeFrequencyLimit = 45009
	// ErrcodeServicerSession (95018): a human servicer holds the session;
	// the reply's Outcome is ServicerSession and it returns
	// kfpipe.ErrServicerSession, which finishes the message.
	ErrcodeServicerSession = 95018
)

// FailNext makes the fake WeChat answer errcode to the next n calls of api
// (APISendMsg, APIMediaUpload, APIMediaGet, …, APIAny), whatever they ask:
// how a handler meets WeChat refusing or failing. Faults asked for one api
// are used in order, before APIAny's.
func (hs *Harness) FailNext(api string, n, errcode int) { hs.fake.FailCalls(api, n, errcode) }

// ExpectNoReplies fails the test unless the handler made no reply of any
// kind — no Reply, Welcome, Transfer or SendEventMessage, sent or not — in
// any attempt: a message the bot must leave alone (a servicer's, an event
// it ignores).
func (r *Result) ExpectNoReplies() *Result {
	r.t.Helper()
	if len(r.Replies) != 0 {
		r.t.Fatalf("kfpipetest: message %s: %d replies, want none: %v", r.Message.UpstreamMsgID, len(r.Replies), r.Replies)
	}
	return r
}
