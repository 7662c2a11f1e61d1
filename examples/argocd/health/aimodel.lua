-- Argo CD health of a servlane.dev AIModel (gopher-lua, Lua 5.1).
-- Healthy: phase Ready, Ready=True and the current generation observed; or scaled to zero (ScaledToZero=True),
-- at rest until a request wakes it. Progressing: not yet observed, Pending or Deploying. Degraded: Degraded
-- or Failed (insufficient GPUs, crash loops, bad source).
local hs = {status = "Progressing", message = "Waiting for the operator to report status"}

local function condition(status, kind)
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type == kind then
        return c
      end
    end
  end
  return nil
end

local function message_of(status, kind, fallback)
  local c = condition(status, kind)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil or status.phase == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.message = "The operator has not yet observed generation " .. tostring(generation)
  return hs
end

local phase = status.phase
local at_zero = condition(status, "ScaledToZero")
if at_zero ~= nil and at_zero.status == "True" then
  -- At rest with no pod until a request wakes it (scale to zero): healthy, as a Deployment scaled to 0 is.
  hs.status = "Healthy"
  hs.message = message_of(status, "ScaledToZero", "Scaled to zero; the next request wakes it")
elseif phase == "Ready" then
  local ready = condition(status, "Ready")
  if ready ~= nil and ready.status == "True" then
    hs.status = "Healthy"
    hs.message = message_of(status, "Ready", "Ready")
  else
    hs.message = message_of(status, "Ready", "Phase Ready but the Ready condition is not True yet")
  end
elseif phase == "Degraded" or phase == "Failed" then
  hs.status = "Degraded"
  hs.message = phase .. ": " .. message_of(status, "Degraded", message_of(status, "Ready", "see the AIModel's events"))
else
  hs.message = phase .. ": " .. message_of(status, "Progressing", "deploying")
end
return hs
