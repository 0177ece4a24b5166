package wecomtest

import (
	"net/http"
	"strings"
)

// Faults on demand: FailCalls makes the next n calls of one API (or of any
// API but gettoken) answer an errcode, before the call is looked at, as
// WeChat answers when it is busy (-1), throttles (45009), does not know
// the access token (40014; the client fetches a new one and calls again)
// or refuses (95018: a servicer holds the session, …). The answer is
// WeChat's JSON error in a 200, as for every API, media/get included.

// APIs FailCalls names (the path after /cgi-bin/).
const (
	APISendMsg        = "kf/send_msg"
	APISendMsgOnEvent = "kf/send_msg_on_event"
	APIServiceState   = "kf/service_state/get"
	APITransfer       = "kf/service_state/trans"
	APISyncMsg        = "kf/sync_msg"
	APIMediaUpload    = "media/upload"
	APIMediaGet       = "media/get"
	// APIAny is any API but gettoken.
	APIAny = "*"
)

// FailCalls makes the next n calls of api (an API… constant, or any path
// after /cgi-bin/) answer errcode; queued faults of one api are used in
// the order they were asked for.
func (s *Server) FailCalls(api string, n, errcode int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults == nil {
		s.faults = map[string][]int{}
	}
	for range n {
		s.faults[api] = append(s.faults[api], errcode)
	}
}

// injectFault answers r with a queued fault of its API (then APIAny's);
// false when none is queued.
func (s *Server) injectFault(w http.ResponseWriter, r *http.Request) bool {
	api := strings.TrimPrefix(r.URL.Path, "/cgi-bin/")
	if api == "gettoken" {
		return false
	}
	s.mu.Lock()
	code, ok := 0, false
	for _, k := range []string{api, APIAny} {
		if q := s.faults[k]; len(q) > 0 {
			code, ok = q[0], true
			s.faults[k] = q[1:]
			break
		}
	}
	s.mu.Unlock()
	if ok {
		writeErr(w, code, "injected fault")
	}
	return ok
}
