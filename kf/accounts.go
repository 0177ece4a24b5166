package kf

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// getReq is a GET call's query, for call.
type getReq url.Values

// Account is a customer-service account (account/list).
type Account struct {
	OpenKfID string `json:"open_kfid"`
	Name     string `json:"name"`
	Avatar   string `json:"avatar"`
	// ManagePrivilege: the app may manage the account (change it, its
	// servicers); false for an account the app may only use.
	ManagePrivilege bool `json:"manage_privilege"`
}

// accountsPage is how many accounts account/list returns per call (its
// most).
const accountsPage = 100

// Accounts lists every customer-service account the app may use
// (account/list, paged by 100).
func (c *Client) Accounts(ctx context.Context) ([]Account, error) {
	var all []Account
	for offset := 0; ; offset += accountsPage {
		var r struct {
			List []Account `json:"account_list"`
		}
		if err := c.call(ctx, "account/list", "/cgi-bin/kf/account/list",
			map[string]any{"offset": offset, "limit": accountsPage}, &r); err != nil {
			return all, err
		}
		all = append(all, r.List...)
		if len(r.List) < accountsPage {
			return all, nil
		}
	}
}

// AddAccount creates an account named name (at most 16 characters) with
// the avatar avatarMediaID (an image uploaded with UploadMedia) and
// returns its open_kfid.
func (c *Client) AddAccount(ctx context.Context, name, avatarMediaID string) (string, error) {
	if name == "" || avatarMediaID == "" {
		return "", errors.New("kf account/add: the name and the avatar's media_id are required")
	}
	var r struct {
		OpenKfID string `json:"open_kfid"`
	}
	err := c.call(ctx, "account/add", "/cgi-bin/kf/account/add", map[string]any{"name": name, "media_id": avatarMediaID}, &r)
	return r.OpenKfID, err
}

// UpdateAccount changes an account's name and/or avatar ("" leaves it).
func (c *Client) UpdateAccount(ctx context.Context, openKfID, name, avatarMediaID string) error {
	in := map[string]any{"open_kfid": openKfID}
	if name != "" {
		in["name"] = name
	}
	if avatarMediaID != "" {
		in["media_id"] = avatarMediaID
	}
	return c.call(ctx, "account/update", "/cgi-bin/kf/account/update", in, nil)
}

// DeleteAccount deletes an account.
func (c *Client) DeleteAccount(ctx context.Context, openKfID string) error {
	return c.call(ctx, "account/del", "/cgi-bin/kf/account/del", map[string]any{"open_kfid": openKfID}, nil)
}

// ContactWay returns the URL customers open to chat with the account
// (add_contact_way); scene (at most 32 bytes of [0-9a-zA-Z_-]) comes back
// in their enter_session event, so a handler knows where they came from.
func (c *Client) ContactWay(ctx context.Context, openKfID, scene string) (string, error) {
	in := map[string]any{"open_kfid": openKfID}
	if scene != "" {
		if err := checkMsgID(scene); err != nil {
			return "", fmt.Errorf("kf add_contact_way: scene: %w", err)
		}
		in["scene"] = scene
	}
	var r struct {
		URL string `json:"url"`
	}
	err := c.call(ctx, "add_contact_way", "/cgi-bin/kf/add_contact_way", in, &r)
	return r.URL, err
}

// Servicer is a servicer (接待人员) of an account (servicer/list).
type Servicer struct {
	UserID string `json:"userid"`
	// Status is 0 on duty, 1 off duty.
	Status int `json:"status"`
	// DepartmentID is set for a department added as a whole.
	DepartmentID int64 `json:"department_id,omitempty"`
}

// ServicerResult is one userid's outcome of AddServicers or
// DeleteServicers: Code 0 is success, anything else WeChat's errcode.
type ServicerResult struct {
	UserID string `json:"userid"`
	Code   int    `json:"errcode"`
	Msg    string `json:"errmsg"`
}

// MaxServicersPerCall is how many userids servicer/add and servicer/del
// take at once.
const MaxServicersPerCall = 100

// AddServicers makes the WeCom members userIDs servicers of the account;
// each userid has its own result.
func (c *Client) AddServicers(ctx context.Context, openKfID string, userIDs []string) ([]ServicerResult, error) {
	return c.servicers(ctx, "servicer/add", openKfID, userIDs)
}

// DeleteServicers removes servicers from the account.
func (c *Client) DeleteServicers(ctx context.Context, openKfID string, userIDs []string) ([]ServicerResult, error) {
	return c.servicers(ctx, "servicer/del", openKfID, userIDs)
}

func (c *Client) servicers(ctx context.Context, api, openKfID string, userIDs []string) ([]ServicerResult, error) {
	if len(userIDs) == 0 || len(userIDs) > MaxServicersPerCall {
		return nil, fmt.Errorf("kf %s: 1 to %d userids, not %d", api, MaxServicersPerCall, len(userIDs))
	}
	var r struct {
		Results []ServicerResult `json:"result_list"`
	}
	err := c.call(ctx, api, "/cgi-bin/kf/"+api, map[string]any{"open_kfid": openKfID, "userid_list": userIDs}, &r)
	return r.Results, err
}

// Servicers lists the account's servicers (servicer/list).
func (c *Client) Servicers(ctx context.Context, openKfID string) ([]Servicer, error) {
	var r struct {
		List []Servicer `json:"servicer_list"`
	}
	err := c.call(ctx, "servicer/list", "/cgi-bin/kf/servicer/list", getReq{"open_kfid": {openKfID}}, &r)
	return r.List, err
}

// CorpStatistic is one day of an account's statistics
// (get_corp_statistic).
type CorpStatistic struct {
	// Day is the day's start (WeChat's stat_time, midnight UTC+8).
	Day time.Time `json:"-"`
	// SessionCount: sessions served; CustomerCount: customers served;
	// CustomerMsgCount: messages customers sent.
	SessionCount     int `json:"session_cnt"`
	CustomerCount    int `json:"customer_cnt"`
	CustomerMsgCount int `json:"customer_msg_cnt"`
	// UpgradeServiceCount: customers handed on (to a servicer or another
	// service) from this account.
	UpgradeServiceCount int `json:"upgrade_service_customer_cnt"`
	// AISessionReplyCount: sessions the smart assistant (the bot)
	// answered; AITransferRate: the share of them handed to a human;
	// AIKnowledgeHitRate: the share of questions the bot's knowledge
	// answered.
	AISessionReplyCount int     `json:"ai_session_reply_cnt"`
	AITransferRate      float64 `json:"ai_transfer_rate"`
	AIKnowledgeHitRate  float64 `json:"ai_knowledge_hit_rate"`
	// MsgRejectedCount: messages the customers refused (blocked).
	MsgRejectedCount int `json:"msg_rejected_customer_cnt"`
}

// ServicerStatistic is one day of a servicer's statistics
// (get_servicer_statistic).
type ServicerStatistic struct {
	Day                   time.Time `json:"-"`
	SessionCount          int       `json:"session_cnt"`
	CustomerCount         int       `json:"customer_cnt"`
	CustomerMsgCount      int       `json:"customer_msg_cnt"`
	ReplyRate             float64   `json:"reply_rate"`
	FirstReplyAverageSecs float64   `json:"first_reply_average_sec"`
	SatisfactionCount     int       `json:"satisfaction_investgate_cnt"`
	SatisfiedCount        int       `json:"satisfied_cnt"`
}

// MaxStatisticDays is how long a range the statistic calls take (WeChat:
// at most 30 days, starting at most 180 days back).
const MaxStatisticDays = 30

func statRange(from, to time.Time) (map[string]any, error) {
	switch {
	case to.Before(from):
		return nil, fmt.Errorf("the range ends (%s) before it starts (%s)", to.Format(time.DateOnly), from.Format(time.DateOnly))
	case to.Sub(from) > MaxStatisticDays*24*time.Hour:
		return nil, fmt.Errorf("the range spans more than %d days", MaxStatisticDays)
	}
	return map[string]any{"start_time": from.Unix(), "end_time": to.Unix()}, nil
}

// CorpStatistics returns the account's statistics per day from from to to
// (at most 30 days).
func (c *Client) CorpStatistics(ctx context.Context, openKfID string, from, to time.Time) ([]CorpStatistic, error) {
	in, err := statRange(from, to)
	if err != nil {
		return nil, fmt.Errorf("kf get_corp_statistic: %w", err)
	}
	in["open_kfid"] = openKfID
	var r struct {
		List []struct {
			StatTime int64         `json:"stat_time"`
			Stat     CorpStatistic `json:"statistic"`
		} `json:"statistic_list"`
	}
	if err := c.call(ctx, "get_corp_statistic", "/cgi-bin/kf/get_corp_statistic", in, &r); err != nil {
		return nil, err
	}
	out := make([]CorpStatistic, len(r.List))
	for i, d := range r.List {
		out[i] = d.Stat
		out[i].Day = time.Unix(d.StatTime, 0)
	}
	return out, nil
}

// ServicerStatistics returns a servicer's statistics for the account per
// day from from to to (at most 30 days); servicer "" sums the account's
// servicers.
func (c *Client) ServicerStatistics(ctx context.Context, openKfID, servicer string, from, to time.Time) ([]ServicerStatistic, error) {
	in, err := statRange(from, to)
	if err != nil {
		return nil, fmt.Errorf("kf get_servicer_statistic: %w", err)
	}
	in["open_kfid"] = openKfID
	if servicer != "" {
		in["servicer_userid"] = servicer
	}
	var r struct {
		List []struct {
			StatTime int64             `json:"stat_time"`
			Stat     ServicerStatistic `json:"statistic"`
		} `json:"statistic_list"`
	}
	if err := c.call(ctx, "get_servicer_statistic", "/cgi-bin/kf/get_servicer_statistic", in, &r); err != nil {
		return nil, err
	}
	out := make([]ServicerStatistic, len(r.List))
	for i, d := range r.List {
		out[i] = d.Stat
		out[i].Day = time.Unix(d.StatTime, 0)
	}
	return out, nil
}
