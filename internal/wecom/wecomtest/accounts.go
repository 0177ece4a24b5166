package wecomtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// The account side of the customer-service API, modelled on WeChat's
// rules:
//
//   - account/list: offset and limit 1–100, every account the app may use;
//     account/add (name 1–16 characters, an uploaded avatar media_id:
//     40007 otherwise), account/update, account/del (95000 for an unknown
//     open_kfid). AddAccount and RemoveAccount change the accounts as the
//     admin console does; with Options.Callback set they also send the
//     kf_account_auth_change callback WeChat sends (NotifyAccounts).
//   - add_contact_way: a URL per account and scene (scene ≤ 32 bytes).
//   - servicer/add, /del (1–100 userids, a result per userid), /list (GET).
//   - get_corp_statistic, get_servicer_statistic: start ≤ end, at most 30
//     days, starting at most 180 days back (40058 otherwise); one entry
//     per day (midnight UTC+8) counted from what the fake saw: customers'
//     messages and customers, sessions with a reply of the API, transfers.

type accountInfo struct {
	name, avatar string
	servicers    []string
}

// accountsState is the fake's account-side state (guarded by Server.mu).
type accountsState struct {
	info map[string]*accountInfo
}

func (s *Server) acc() *accountsState {
	if s.accs == nil {
		s.accs = &accountsState{info: map[string]*accountInfo{}}
	}
	return s.accs
}

func (s *Server) infoOf(openKfID string) *accountInfo {
	a := s.acc().info[openKfID]
	if a == nil {
		a = &accountInfo{name: "account " + openKfID}
		s.acc().info[openKfID] = a
	}
	return a
}

// RemoveAccount removes openKfID, as the admin console does: sync_msg and
// the other calls on it answer 95000 from now on.
func (s *Server) RemoveAccount(openKfID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.accounts, openKfID)
	delete(s.acc().info, openKfID)
}

// NotifyAccounts sends the kf_account_auth_change callback with
// Options.Callback: added and removed accounts.
func (s *Server) NotifyAccounts(ctx context.Context, added, removed []string) error {
	if s.opts.Callback == nil {
		return fmt.Errorf("wecomtest: NotifyAccounts needs Options.Callback")
	}
	resp, err := s.opts.Callback.SendAccountAuthChange(ctx, added, removed)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("wecomtest: callback answered %s", resp.Status)
	}
	return nil
}

// accountPaths are the account side's APIs.
var accountPaths = map[string]bool{
	"/cgi-bin/kf/account/list": true, "/cgi-bin/kf/account/add": true, "/cgi-bin/kf/account/update": true,
	"/cgi-bin/kf/account/del": true, "/cgi-bin/kf/add_contact_way": true, "/cgi-bin/kf/servicer/add": true,
	"/cgi-bin/kf/servicer/del": true, "/cgi-bin/kf/servicer/list": true, "/cgi-bin/kf/get_corp_statistic": true,
	"/cgi-bin/kf/get_servicer_statistic": true,
}

// serveAccounts answers the account side's APIs (false: not one of them).
func (s *Server) serveAccounts(w http.ResponseWriter, r *http.Request) bool {
	if !accountPaths[r.URL.Path] {
		return false
	}
	get := r.URL.Path == "/cgi-bin/kf/servicer/list"
	if (get && r.Method != http.MethodGet) || (!get && r.Method != http.MethodPost) {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return true
	}
	var b struct {
		Offset   int      `json:"offset"`
		Limit    int      `json:"limit"`
		OpenKfID string   `json:"open_kfid"`
		Name     string   `json:"name"`
		MediaID  string   `json:"media_id"`
		Scene    string   `json:"scene"`
		UserIDs  []string `json:"userid_list"`
		Servicer string   `json:"servicer_userid"`
		Start    int64    `json:"start_time"`
		End      int64    `json:"end_time"`
	}
	var decErr error
	if get {
		b.OpenKfID = r.URL.Query().Get("open_kfid")
	} else {
		decErr = json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&b)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.authorize(w, r) {
		return true
	}
	if decErr != nil {
		writeErr(w, 40058, "invalid parameter")
		return true
	}
	ok := func(v map[string]any) {
		v["errcode"], v["errmsg"] = 0, "ok"
		writeJSON(w, v)
	}
	path := r.URL.Path
	if path != "/cgi-bin/kf/account/list" && path != "/cgi-bin/kf/account/add" && !s.accounts[b.OpenKfID] {
		writeErr(w, 95000, "invalid open_kfid")
		return true
	}
	switch path {
	case "/cgi-bin/kf/account/list":
		if b.Limit == 0 {
			b.Limit = 100
		}
		if b.Offset < 0 || b.Limit < 1 || b.Limit > 100 {
			writeErr(w, 40058, "invalid offset or limit")
			return true
		}
		ids := make([]string, 0, len(s.accounts))
		for id := range s.accounts {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		list := []map[string]any{}
		for _, id := range ids[min(b.Offset, len(ids)):min(b.Offset+b.Limit, len(ids))] {
			a := s.infoOf(id)
			list = append(list, map[string]any{"open_kfid": id, "name": a.name, "avatar": a.avatar, "manage_privilege": true})
		}
		ok(map[string]any{"account_list": list})
	case "/cgi-bin/kf/account/add", "/cgi-bin/kf/account/update":
		add := path == "/cgi-bin/kf/account/add"
		switch {
		case (add || b.Name != "") && (b.Name == "" || len([]rune(b.Name)) > 16):
			writeErr(w, 40058, "name must be 1 to 16 characters")
			return true
		case (add || b.MediaID != "") && !s.kf().media[b.MediaID]:
			writeErr(w, 40007, "invalid media_id")
			return true
		}
		id := b.OpenKfID
		if add {
			id = "wk" + randHex(8)
			s.accounts[id] = true
		}
		a := s.infoOf(id)
		if b.Name != "" {
			a.name = b.Name
		}
		if b.MediaID != "" {
			a.avatar = "https://wework.qpic.cn/fake/" + b.MediaID
		}
		if add {
			ok(map[string]any{"open_kfid": id})
		} else {
			ok(map[string]any{})
		}
	case "/cgi-bin/kf/account/del":
		delete(s.accounts, b.OpenKfID)
		delete(s.acc().info, b.OpenKfID)
		ok(map[string]any{})
	case "/cgi-bin/kf/add_contact_way":
		if len(b.Scene) > 32 {
			writeErr(w, 40058, "scene longer than 32 bytes")
			return true
		}
		ok(map[string]any{"url": "https://work.weixin.qq.com/kfid/" + b.OpenKfID + "?enc_scene=" + b.Scene})
	case "/cgi-bin/kf/servicer/add", "/cgi-bin/kf/servicer/del":
		if len(b.UserIDs) == 0 || len(b.UserIDs) > 100 {
			writeErr(w, 40058, "userid_list must hold 1 to 100 userids")
			return true
		}
		a := s.infoOf(b.OpenKfID)
		results := []map[string]any{}
		for _, u := range b.UserIDs {
			i := slices.Index(a.servicers, u)
			code, msg := 0, "ok"
			switch {
			case path == "/cgi-bin/kf/servicer/add" && i < 0:
				a.servicers = append(a.servicers, u)
			case path == "/cgi-bin/kf/servicer/del" && i >= 0:
				a.servicers = slices.Delete(a.servicers, i, i+1)
			case path == "/cgi-bin/kf/servicer/del":
				code, msg = 95014, "user is not a servicer"
			}
			results = append(results, map[string]any{"userid": u, "errcode": code, "errmsg": msg})
		}
		ok(map[string]any{"result_list": results})
	case "/cgi-bin/kf/servicer/list":
		list := []map[string]any{}
		for _, u := range s.infoOf(b.OpenKfID).servicers {
			list = append(list, map[string]any{"userid": u, "status": 0})
		}
		ok(map[string]any{"servicer_list": list})
	default:
		now := s.opts.Clock()
		start, end := time.Unix(b.Start, 0), time.Unix(b.End, 0)
		if b.Start == 0 || end.Before(start) || end.Sub(start) > 30*24*time.Hour || now.Sub(start) > 180*24*time.Hour {
			writeErr(w, 40058, "invalid start_time or end_time")
			return true
		}
		ok(map[string]any{"statistic_list": s.statistics(b.OpenKfID, b.Servicer, start, end, path == "/cgi-bin/kf/get_servicer_statistic")})
	}
	return true
}

// utc8 is WeChat's day boundary.
var utc8 = time.FixedZone("UTC+8", 8*3600)

func dayOf(t time.Time) time.Time {
	t = t.In(utc8)
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, utc8)
}

// statistics counts, per day of [start, end], what the fake saw of
// openKfID (s.mu held).
func (s *Server) statistics(openKfID, servicer string, start, end time.Time, perServicer bool) []map[string]any {
	type day struct {
		msgs      int
		customers map[string]bool
		answered  map[string]bool
		handed    map[string]bool
	}
	days := map[int64]*day{}
	at := func(t time.Time) *day {
		k := dayOf(t).Unix()
		if days[k] == nil {
			days[k] = &day{customers: map[string]bool{}, answered: map[string]bool{}, handed: map[string]bool{}}
		}
		return days[k]
	}
	for _, e := range s.logs[openKfID] {
		var m struct {
			User   string `json:"external_userid"`
			Origin int    `json:"origin"`
		}
		_ = json.Unmarshal(e.raw, &m)
		if m.User == "" || m.Origin != 3 {
			continue
		}
		d := at(time.Unix(e.sendTime, 0))
		d.msgs++
		d.customers[m.User] = true
	}
	for _, r := range s.kf().replies {
		if r.OpenKfID == openKfID && !r.OnEvent {
			at(r.At).answered[r.User] = true
		}
	}
	for _, t := range s.kf().transfers {
		if t.OpenKfID == openKfID && t.To == 3 && (servicer == "" || t.Servicer == servicer) {
			at(t.At).handed[t.User] = true
		}
	}
	out := []map[string]any{}
	for d := dayOf(start); !d.After(end); d = d.AddDate(0, 0, 1) {
		st := days[d.Unix()]
		if st == nil {
			st = &day{}
		}
		var stat map[string]any
		if perServicer {
			stat = map[string]any{"session_cnt": len(st.handed), "customer_cnt": len(st.handed),
				"customer_msg_cnt": 0, "reply_rate": 0.0, "first_reply_average_sec": 0.0,
				"satisfaction_investgate_cnt": 0, "satisfied_cnt": 0}
		} else {
			rate := 0.0
			if len(st.answered) > 0 {
				rate = float64(len(st.handed)) / float64(len(st.answered))
			}
			stat = map[string]any{"session_cnt": len(st.customers), "customer_cnt": len(st.customers),
				"customer_msg_cnt": st.msgs, "upgrade_service_customer_cnt": len(st.handed),
				"ai_session_reply_cnt": len(st.answered), "ai_transfer_rate": rate, "ai_knowledge_hit_rate": 0.0,
				"msg_rejected_customer_cnt": 0}
		}
		out = append(out, map[string]any{"stat_time": d.Unix(), "statistic": stat})
	}
	return out
}
