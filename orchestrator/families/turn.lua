-- The turn family's liveness rule (the census and every live-work check read it): queued,
-- running, or cancelling with a step in flight (its lease present). Cancelling with no lease:
-- its worker is gone, 'stale'.
local function turn_verdict(tid)
  local st = redis.call('HGET', K.turn(tid), 'state')
  if st == TURN.QUEUED or st == TURN.RUNNING then return 'live' end
  if st == TURN.CANCELLING then
    return redis.call('EXISTS', K.step_lease(tid)) == 1 and 'live' or 'stale'
  end
  return false
end

family('turn', {
  key = K.live_turns,
  ids = function(sid) return redis.call('ZRANGE', K.live_turns(sid), 0, -1) end,
  verdict = turn_verdict, hash = K.turn, fields = {'state', 'prompt'},
})
